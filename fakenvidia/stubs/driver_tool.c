/*
 * The stub driver tools of the fake driver root (nvidia-smi, nvidia-persistenced, ...): one
 * program, copied under each name.
 *
 * The NVIDIA Container Toolkit looks these up on the driver root and mounts them into containers;
 * it does not run them. A stub says what it is and fails, so nothing mistakes its silence for a
 * healthy GPU.
 */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *name = argc > 0 ? argv[0] : "nvidia-tool";
    const char *slash = strrchr(name, '/');
    fprintf(stderr, "%s: gpushare fake NVIDIA driver: a stand-in with no GPU behind it\n", slash ? slash + 1 : name);
    return 1;
}
