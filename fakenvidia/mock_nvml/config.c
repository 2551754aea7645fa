/*
 * The mock's configuration: which GPUs it reports and where it reads health events from.
 *
 * A small key=value file, one setting a line, '#' starting a comment line:
 *
 *     count = 8
 *     name = NVIDIA A100-SXM4-40GB
 *     name.3 = NVIDIA A100-SXM4-80GB
 *     memory_mib = 40960
 *     driver_version = 570.172.08
 *     cuda_driver_version = 12080
 *     uuid_seed = node-a
 *     events_dir = /run/gpushare-mock-nvml/events
 *
 * The file is $GPUSHARE_MOCK_NVML_CONFIG when that is set, else gpushare-mock-nvml.conf in the
 * directory the library was loaded from, else none (the defaults below). The second place exists
 * because the callers that matter are started by others: nvidia-container-runtime by containerd,
 * the device plugin by kubelet, with environments a test does not control, while all of them load
 * libnvidia-ml.so.1 from the same driver root, where the fake driver root puts the file.
 * $GPUSHARE_MOCK_NVML_EVENTS, when set, overrides events_dir. A relative events_dir is relative
 * to the file's directory, so a driver root stays valid wherever it is mounted.
 *
 * Anything the parser does not understand is an error that fails nvmlInit_v2, never a default.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mock.h"

#define DEFAULT_COUNT 8
#define DEFAULT_NAME "NVIDIA A100-SXM4-40GB"
#define DEFAULT_MEMORY_MIB 40960ULL
#define DEFAULT_DRIVER_VERSION "570.172.08"
#define DEFAULT_CUDA_DRIVER_VERSION 12080 /* CUDA 12.8, what the R570 driver reports */
#define DEFAULT_UUID_SEED "gpushare"

/* Generous for a handful of lines; bounds what a bad path can make the library read. */
#define MAX_CONFIG_BYTES 16384
#define MAX_MEMORY_MIB (1ULL << 24) /* 16 TiB */

/* Any address inside this library, for dladdr. */
static const char library_marker;

static void set_error(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void set_error(char *err, size_t err_size, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(err, err_size, fmt, args);
    va_end(args);
}

static void set_defaults(struct mock_config *config)
{
    memset(config, 0, sizeof(*config));
    config->count = DEFAULT_COUNT;
    for (unsigned int i = 0; i < MOCK_MAX_GPUS; i++) {
        snprintf(config->names[i], sizeof(config->names[i]), "%s", DEFAULT_NAME);
    }
    config->memory_mib = DEFAULT_MEMORY_MIB;
    snprintf(config->driver_version, sizeof(config->driver_version), "%s", DEFAULT_DRIVER_VERSION);
    config->cuda_driver_version = DEFAULT_CUDA_DRIVER_VERSION;
    snprintf(config->uuid_seed, sizeof(config->uuid_seed), "%s", DEFAULT_UUID_SEED);
}

int mock_parse_uint(const char *text, unsigned long long max, unsigned long long *out)
{
    if (*text < '0' || *text > '9') {
        return -1;
    }
    errno = 0;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || value > max) {
        return -1;
    }
    *out = value;
    return 0;
}

/* Printable ASCII, non-empty, shorter than size: what ends up in NVML's fixed-size string buffers. */
static int copy_text(char *dst, size_t size, const char *value)
{
    size_t len = strlen(value);
    if (len == 0 || len >= size) {
        return -1;
    }
    for (size_t i = 0; i < len; i++) {
        if (value[i] < 0x20 || value[i] > 0x7e) {
            return -1;
        }
    }
    memcpy(dst, value, len + 1);
    return 0;
}

/* A driver version becomes a library file name suffix (libcuda.so.<version>): digits and dots only. */
static int is_version(const char *value)
{
    if (*value == '\0' || *value == '.') {
        return 0;
    }
    for (const char *p = value; *p != '\0'; p++) {
        if ((*p < '0' || *p > '9') && *p != '.') {
            return 0;
        }
    }
    return 1;
}

char *mock_trim(char *s)
{
    while (*s == ' ' || *s == '\t') {
        s++;
    }
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) {
        *--end = '\0';
    }
    return s;
}

/* The directory part of path ("." when there is none), into dir of dir_size bytes. */
static int directory_of(const char *path, char *dir, size_t dir_size)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        return snprintf(dir, dir_size, ".") < (int)dir_size ? 0 : -1;
    }
    size_t len = slash == path ? 1 : (size_t)(slash - path);
    if (len >= dir_size) {
        return -1;
    }
    memcpy(dir, path, len);
    dir[len] = '\0';
    return 0;
}

static int set_events_dir(struct mock_config *config, const char *config_dir, const char *value)
{
    int n;
    if (value[0] == '/') {
        n = snprintf(config->events_dir, sizeof(config->events_dir), "%s", value);
    } else {
        n = snprintf(config->events_dir, sizeof(config->events_dir), "%s/%s", config_dir, value);
    }
    return n > 0 && (size_t)n < sizeof(config->events_dir) ? 0 : -1;
}

/* One "key = value" setting. Returns 0, or -1 with err naming what is wrong with it. */
static int apply_setting(struct mock_config *config, const char *config_dir, const char *key, const char *value,
                         char *err, size_t err_size)
{
    unsigned long long number;

    if (strcmp(key, "count") == 0) {
        if (mock_parse_uint(value, MOCK_MAX_GPUS, &number) != 0 || number == 0) {
            set_error(err, err_size, "count must be a whole number from 1 to %d, not '%s'", MOCK_MAX_GPUS, value);
            return -1;
        }
        config->count = (unsigned int)number;
    } else if (strcmp(key, "name") == 0) {
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
        if (copy_text(name, sizeof(name), value) != 0) {
            set_error(err, err_size, "name must be 1 to %d printable ASCII characters", NVML_DEVICE_NAME_V2_BUFFER_SIZE - 1);
            return -1;
        }
        for (unsigned int i = 0; i < MOCK_MAX_GPUS; i++) {
            memcpy(config->names[i], name, sizeof(name));
        }
    } else if (strncmp(key, "name.", 5) == 0) {
        if (mock_parse_uint(key + 5, MOCK_MAX_GPUS - 1, &number) != 0) {
            set_error(err, err_size, "'%s' names no GPU index from 0 to %d", key, MOCK_MAX_GPUS - 1);
            return -1;
        }
        if (copy_text(config->names[number], sizeof(config->names[number]), value) != 0) {
            set_error(err, err_size, "%s must be 1 to %d printable ASCII characters", key, NVML_DEVICE_NAME_V2_BUFFER_SIZE - 1);
            return -1;
        }
    } else if (strcmp(key, "memory_mib") == 0) {
        if (mock_parse_uint(value, MAX_MEMORY_MIB, &number) != 0 || number == 0) {
            set_error(err, err_size, "memory_mib must be a whole number from 1 to %llu, not '%s'", MAX_MEMORY_MIB, value);
            return -1;
        }
        config->memory_mib = number;
    } else if (strcmp(key, "driver_version") == 0) {
        if (!is_version(value) || copy_text(config->driver_version, sizeof(config->driver_version), value) != 0) {
            set_error(err, err_size, "driver_version must be digits and dots such as 570.172.08, not '%s'", value);
            return -1;
        }
    } else if (strcmp(key, "cuda_driver_version") == 0) {
        if (mock_parse_uint(value, 999999, &number) != 0 || number == 0) {
            set_error(err, err_size, "cuda_driver_version must be NVML's number such as 12080 for 12.8, not '%s'", value);
            return -1;
        }
        config->cuda_driver_version = (int)number;
    } else if (strcmp(key, "uuid_seed") == 0) {
        if (copy_text(config->uuid_seed, sizeof(config->uuid_seed), value) != 0) {
            set_error(err, err_size, "uuid_seed must be 1 to %d printable ASCII characters", MOCK_UUID_SEED_SIZE - 1);
            return -1;
        }
    } else if (strcmp(key, "events_dir") == 0) {
        if (value[0] == '\0' || set_events_dir(config, config_dir, value) != 0) {
            set_error(err, err_size, "events_dir must be a path shorter than %d bytes", PATH_MAX);
            return -1;
        }
    } else {
        set_error(err, err_size, "unknown key '%s'", key);
        return -1;
    }
    return 0;
}

/* Reads a whole file of at most MAX_CONFIG_BYTES into buf (NUL-terminated). 1 if it does not exist. */
static int read_file(const char *path, char *buf, size_t buf_size, char *err, size_t err_size)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        if (errno == ENOENT) {
            return 1;
        }
        set_error(err, err_size, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    size_t n = fread(buf, 1, buf_size - 1, f);
    int failed = ferror(f);
    int too_big = !failed && n == buf_size - 1 && fgetc(f) != EOF;
    fclose(f);
    if (failed) {
        set_error(err, err_size, "cannot read %s", path);
        return -1;
    }
    if (too_big) {
        set_error(err, err_size, "%s is larger than %d bytes", path, MAX_CONFIG_BYTES);
        return -1;
    }
    if (memchr(buf, '\0', n) != NULL) {
        set_error(err, err_size, "%s is not a text file", path);
        return -1;
    }
    buf[n] = '\0';
    return 0;
}

static int parse_file(struct mock_config *config, const char *path, char *text, char *err, size_t err_size)
{
    char config_dir[PATH_MAX];
    if (directory_of(path, config_dir, sizeof(config_dir)) != 0) {
        set_error(err, err_size, "config path too long: %s", path);
        return -1;
    }

    unsigned int line_number = 0;
    char *next = text;
    while (next != NULL) {
        char *line = next;
        char *newline = strchr(line, '\n');
        if (newline != NULL) {
            *newline = '\0';
            next = newline + 1;
        } else {
            next = NULL;
        }
        line_number++;

        line = mock_trim(line);
        if (*line == '\0' || *line == '#') {
            continue;
        }
        char *equals = strchr(line, '=');
        if (equals == NULL) {
            set_error(err, err_size, "%s:%u: expected key = value", path, line_number);
            return -1;
        }
        *equals = '\0';
        char *key = mock_trim(line);
        char *value = mock_trim(equals + 1);

        char problem[384];
        if (apply_setting(config, config_dir, key, value, problem, sizeof(problem)) != 0) {
            set_error(err, err_size, "%s:%u: %s", path, line_number, problem);
            return -1;
        }
    }
    return 0;
}

/* The sidecar file's path, next to this library; -1 if the library's own path is unknown or too long. */
static int sidecar_path(char *path, size_t size)
{
    Dl_info info;
    if (dladdr(&library_marker, &info) == 0 || info.dli_fname == NULL || strchr(info.dli_fname, '/') == NULL) {
        return -1;
    }
    char dir[PATH_MAX];
    if (directory_of(info.dli_fname, dir, sizeof(dir)) != 0) {
        return -1;
    }
    int n = snprintf(path, size, "%s/%s", dir, MOCK_SIDECAR_CONFIG_NAME);
    return n > 0 && (size_t)n < size ? 0 : -1;
}

int mock_config_load(struct mock_config *config, char *err, size_t err_size)
{
    /* Only ever used from nvmlInit_v2, under mock_lock. */
    static char text[MAX_CONFIG_BYTES + 1];
    char path[PATH_MAX];

    set_defaults(config);

    const char *explicit_path = getenv(MOCK_CONFIG_ENV);
    int have_path;
    if (explicit_path != NULL && explicit_path[0] != '\0') {
        have_path = snprintf(path, sizeof(path), "%s", explicit_path) < (int)sizeof(path);
        if (!have_path) {
            set_error(err, err_size, "%s is longer than %d bytes", MOCK_CONFIG_ENV, PATH_MAX);
            return -1;
        }
    } else {
        have_path = sidecar_path(path, sizeof(path)) == 0;
    }

    if (have_path) {
        int read = read_file(path, text, sizeof(text), err, err_size);
        if (read < 0) {
            return -1;
        }
        if (read == 1 && explicit_path != NULL && explicit_path[0] != '\0') {
            set_error(err, err_size, "%s names %s, which does not exist", MOCK_CONFIG_ENV, path);
            return -1;
        }
        if (read == 0 && parse_file(config, path, text, err, err_size) != 0) {
            return -1;
        }
    }

    const char *events = getenv(MOCK_EVENTS_ENV);
    if (events != NULL && events[0] != '\0') {
        if (events[0] != '/' || snprintf(config->events_dir, sizeof(config->events_dir), "%s", events) >= PATH_MAX) {
            set_error(err, err_size, "%s must be an absolute path shorter than %d bytes", MOCK_EVENTS_ENV, PATH_MAX);
            return -1;
        }
    }
    return 0;
}
