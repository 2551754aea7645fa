"""spot"""
