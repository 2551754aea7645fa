/*
 * Every stub driver library of the fake driver root (libcuda.so.1, libnvidia-ptxjitcompiler.so.1,
 * ...) is this file, linked once per soname.
 *
 * The NVIDIA Container Toolkit only finds, reads and mounts these libraries: it reads their ELF
 * headers through ldconfig's cache, never calls into them. So a stub needs a real ELF shared object
 * with the right soname and nothing more. Nothing in a container can use it as its library: no
 * CUDA symbol is defined, so a program linked against CUDA fails to load rather than run on a GPU
 * that is not there.
 */
__attribute__((visibility("default"))) const char gpushare_fake_nvidia_driver_stub[] =
    "gpushare fake NVIDIA driver: a stand-in library with no GPU behind it";
