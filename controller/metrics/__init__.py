"""GPU metrics: vendor exporter adapters, the scraper, the fake exporter and the agent's /metrics exposition."""
