/*
 * Event sets, and the directory through which a test makes a GPU report an XID.
 *
 * The real library learns of XIDs from the kernel driver. The mock learns of them from files: a
 * test writes a file whose name ends in ".event" into the events directory (config.c), e.g.
 *
 *     gpu = 3          (or: uuid = GPU-...)
 *     xid = 79
 *
 * writing it under another name first and renaming it into place, so the mock never reads half a
 * file. nvmlEventSetWait_v2 polls the directory and delivers, in file name order, the first event
 * for a GPU that its set registered for XID events: it claims the file by renaming it to
 * "<name>.delivered", so each event reaches exactly one waiter, in this process or another, and
 * the test can see that it did. A file it cannot parse, or that names no GPU, becomes
 * "<name>.invalid" and is reported on stderr. An event waits in the directory until some set that
 * registered its GPU takes it; unlike the real driver's events it is not lost when nobody has
 * registered yet, so a test never races the device plugin's registration.
 */
#define _GNU_SOURCE /* O_CLOEXEC, O_NOFOLLOW, strdup */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mock.h"

#define EVENT_SUFFIX ".event"
#define DELIVERED_SUFFIX ".delivered"
#define INVALID_SUFFIX ".invalid"
/* Latency of an event against the cost of a directory scan; the device plugin waits 5 s at a time. */
#define POLL_INTERVAL_MS 20
#define MAX_EVENT_FILE_BYTES 512
/* Files looked at per scan; more wait for a later scan, after these are claimed or marked invalid. */
#define MAX_FILES_PER_SCAN 1024
#define NO_MIG_INSTANCE 0xFFFFFFFFU

/* What one wait needs from the shared state, copied under mock_lock so the scan can run without it. */
struct waiter {
    unsigned long long generation;
    unsigned int count;
    unsigned long long registered[MOCK_MAX_GPUS];
    char uuids[MOCK_MAX_GPUS][NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char events_dir[PATH_MAX];
};

/* The slot a handle names, or NULL if it is no set that is in use. Under mock_lock. */
static struct nvmlEventSet_st *event_set(nvmlEventSet_t handle)
{
    uintptr_t wanted = (uintptr_t)handle;
    for (unsigned int i = 0; i < MOCK_MAX_EVENT_SETS; i++) {
        struct nvmlEventSet_st *s = &mock.event_sets[i];
        if ((uintptr_t)s == wanted) {
            return s->in_use ? s : NULL;
        }
    }
    return NULL;
}

void mock_event_sets_reset(void)
{
    for (unsigned int i = 0; i < MOCK_MAX_EVENT_SETS; i++) {
        struct nvmlEventSet_st *s = &mock.event_sets[i];
        unsigned long long generation = s->generation + 1;
        memset(s, 0, sizeof(*s));
        s->generation = generation;
    }
}

NVML_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (set == NULL) {
        mock_leave();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    ret = NVML_ERROR_MEMORY; /* every slot taken: a caller that never frees its sets */
    for (unsigned int i = 0; i < MOCK_MAX_EVENT_SETS; i++) {
        struct nvmlEventSet_st *s = &mock.event_sets[i];
        if (!s->in_use) {
            unsigned long long generation = s->generation + 1;
            memset(s, 0, sizeof(*s));
            s->in_use = 1;
            s->generation = generation;
            *set = s;
            ret = NVML_SUCCESS;
            break;
        }
    }
    mock_leave();
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    struct nvmlEventSet_st *s = event_set(set);
    if (s == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        unsigned long long generation = s->generation + 1;
        memset(s, 0, sizeof(*s));
        s->generation = generation;
    }
    mock_leave();
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                  nvmlEventSet_t set)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    const struct nvmlDevice_st *d = mock_device(device);
    struct nvmlEventSet_st *s = event_set(set);
    if (d == NULL || s == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if ((eventTypes & ~(unsigned long long)MOCK_SUPPORTED_EVENT_TYPES) != 0) {
        /* As NVIDIA documents it: none of the requested types is registered then. */
        ret = NVML_ERROR_NOT_SUPPORTED;
    } else {
        s->registered[d->index] |= eventTypes;
    }
    mock_leave();
    return ret;
}

/* Copies what the wait needs. On success *w is filled; first is set on the wait's first round. */
static nvmlReturn_t take_snapshot(nvmlEventSet_t set, int first, struct waiter *w)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    const struct nvmlEventSet_st *s = event_set(set);
    /* A set freed, or freed and created again, while a thread waits on it is the caller's bug. */
    if (s == NULL || (!first && s->generation != w->generation)) {
        mock_leave();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    w->generation = s->generation;
    w->count = mock.config.count;
    memcpy(w->registered, s->registered, sizeof(w->registered));
    for (unsigned int i = 0; i < w->count; i++) {
        memcpy(w->uuids[i], mock.devices[i].uuid, sizeof(w->uuids[i]));
    }
    memcpy(w->events_dir, mock.config.events_dir, sizeof(w->events_dir));
    mock_leave();
    return NVML_SUCCESS;
}

static int has_suffix(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n > k && strcmp(name + n - k, suffix) == 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* An event file's contents, up to MAX_EVENT_FILE_BYTES, NUL-terminated. -1 if it is no readable regular file. */
static int read_event_file(const char *path, char *buf, size_t size)
{
    /* O_NONBLOCK: a FIFO dropped in the directory must not hang the waiter. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        return -1;
    }
    struct stat st;
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < (off_t)size) {
        n = read(fd, buf, size - 1);
    }
    close(fd);
    if (n < 0 || memchr(buf, '\0', (size_t)n) != NULL) {
        return -1;
    }
    buf[n] = '\0';
    return 0;
}

/* The GPU index and XID an event file names. Returns 0, or -1 with why set. */
static int parse_event(char *text, const struct waiter *w, unsigned int *gpu, unsigned long long *xid,
                       const char **why)
{
    int have_gpu = 0, have_xid = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        line = mock_trim(line);
        if (*line == '\0' || *line == '#') {
            continue;
        }
        char *equals = strchr(line, '=');
        if (equals == NULL) {
            *why = "a line is not key = value";
            return -1;
        }
        *equals = '\0';
        const char *key = mock_trim(line);
        const char *value = mock_trim(equals + 1);
        unsigned long long number;

        if (strcmp(key, "xid") == 0) {
            if (have_xid || mock_parse_uint(value, UINT32_MAX, &number) != 0) {
                *why = "xid must be given once, as a whole number";
                return -1;
            }
            *xid = number;
            have_xid = 1;
        } else if (strcmp(key, "gpu") == 0 || strcmp(key, "uuid") == 0) {
            if (have_gpu) {
                *why = "the GPU must be named once, by gpu or by uuid";
                return -1;
            }
            have_gpu = 1;
            int found = 0;
            if (strcmp(key, "gpu") == 0) {
                found = mock_parse_uint(value, UINT32_MAX, &number) == 0 && number < w->count;
                if (found) {
                    *gpu = (unsigned int)number;
                }
            } else {
                for (unsigned int i = 0; i < w->count && !found; i++) {
                    if (strcmp(value, w->uuids[i]) == 0) {
                        *gpu = i;
                        found = 1;
                    }
                }
            }
            if (!found) {
                *why = "it names no GPU of this mock";
                return -1;
            }
        } else {
            *why = "unknown key (gpu, uuid and xid are known)";
            return -1;
        }
    }
    if (!have_gpu || !have_xid) {
        *why = "it needs a GPU (gpu or uuid) and an xid";
        return -1;
    }
    return 0;
}

/* Renames dir/name to dir/name<suffix>; 0 on success. Only one of several racing renames succeeds. */
static int rename_with_suffix(const char *dir, const char *name, const char *suffix)
{
    char from[PATH_MAX], to[PATH_MAX];
    int a = snprintf(from, sizeof(from), "%s/%s", dir, name);
    int b = snprintf(to, sizeof(to), "%s/%s%s", dir, name, suffix);
    if (a < 0 || b < 0 || (size_t)a >= sizeof(from) || (size_t)b >= sizeof(to)) {
        return -1;
    }
    return rename(from, to);
}

/* Looks at one event file: 1 if this waiter claimed it (*gpu, *xid set), 0 otherwise. */
static int consider(const struct waiter *w, const char *name, unsigned int *gpu, unsigned long long *xid)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s/%s", w->events_dir, name);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        return 0;
    }
    char text[MAX_EVENT_FILE_BYTES];
    const char *why = "it is not a readable text file of at most 511 bytes";
    if (read_event_file(path, text, sizeof(text)) != 0 || parse_event(text, w, gpu, xid, &why) != 0) {
        /* Whoever renames it first reports it; a file another waiter just claimed is simply gone. */
        if (rename_with_suffix(w->events_dir, name, INVALID_SUFFIX) == 0) {
            fprintf(stderr, "gpushare mock NVML: ignoring event file %s: %s\n", path, why);
        }
        return 0;
    }
    if ((w->registered[*gpu] & nvmlEventTypeXidCriticalError) == 0) {
        return 0;
    }
    return rename_with_suffix(w->events_dir, name, DELIVERED_SUFFIX) == 0;
}

/* Scans the events directory once. 1 if an event for this waiter was claimed. */
static int take_event(const struct waiter *w, unsigned int *gpu, unsigned long long *xid)
{
    DIR *dir = opendir(w->events_dir);
    if (dir == NULL) {
        return 0; /* not created yet: no events yet */
    }
    char **names = calloc(MAX_FILES_PER_SCAN, sizeof(*names));
    size_t count = 0;
    if (names != NULL) {
        struct dirent *entry;
        while (count < MAX_FILES_PER_SCAN && (entry = readdir(dir)) != NULL) {
            if (entry->d_name[0] != '.' && has_suffix(entry->d_name, EVENT_SUFFIX)) {
                names[count] = strdup(entry->d_name);
                if (names[count] != NULL) {
                    count++;
                }
            }
        }
    }
    closedir(dir);
    if (names == NULL) {
        return 0;
    }

    qsort(names, count, sizeof(*names), compare_names);
    int taken = 0;
    for (size_t i = 0; i < count && !taken; i++) {
        taken = consider(w, names[i], gpu, xid);
    }
    for (size_t i = 0; i < count; i++) {
        free(names[i]);
    }
    free(names);
    return taken;
}

#define NS_PER_MS 1000000LL
#define NS_PER_S 1000000000LL

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static void sleep_ns(long long ns)
{
    struct timespec left = {.tv_sec = (time_t)(ns / NS_PER_S), .tv_nsec = (long)(ns % NS_PER_S)};
    /* Go's runtime signals its threads; a sleep cut short is finished, not cut. */
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (data == NULL) {
        /* Still UNINITIALIZED before INVALID_ARGUMENT, as every other entry point answers. */
        nvmlReturn_t ret = mock_enter();
        if (ret == NVML_SUCCESS) {
            mock_leave();
        }
        return ret == NVML_SUCCESS ? NVML_ERROR_INVALID_ARGUMENT : ret;
    }

    const long long deadline = now_ns() + (long long)timeoutms * NS_PER_MS;
    struct waiter w;
    nvmlReturn_t ret = take_snapshot(set, 1, &w);
    while (ret == NVML_SUCCESS) {
        unsigned int gpu = 0;
        unsigned long long xid = 0;
        if (w.events_dir[0] != '\0' && take_event(&w, &gpu, &xid)) {
            ret = mock_enter();
            if (ret != NVML_SUCCESS) {
                return ret;
            }
            if (gpu >= mock.config.count) {
                /* NVML was shut down and initialized with fewer GPUs while this thread scanned. */
                mock_leave();
                return NVML_ERROR_UNKNOWN;
            }
            data->device = &mock.devices[gpu];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = xid;
            data->gpuInstanceId = NO_MIG_INSTANCE;
            data->computeInstanceId = NO_MIG_INSTANCE;
            mock_leave();
            return NVML_SUCCESS;
        }
        long long left = deadline - now_ns();
        if (left <= 0) {
            return NVML_ERROR_TIMEOUT;
        }
        sleep_ns(left < POLL_INTERVAL_MS * NS_PER_MS ? left : POLL_INTERVAL_MS * NS_PER_MS);
        ret = take_snapshot(set, 0, &w);
    }
    return ret;
}
