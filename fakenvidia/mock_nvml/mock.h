/*
 * The mock NVML's own state: the configured GPUs, the init reference count and the event sets.
 *
 * NVML is called from several threads at once (the device plugin's health goroutine waits on an
 * event set while others query devices), so every read or write of this state happens under
 * mock_lock. The device table is rebuilt only when the reference count goes from 0 to 1, when no
 * handle from a previous initialization is valid any more, as with the real library.
 */
#ifndef GPUSHARE_FAKENVIDIA_MOCK_H
#define GPUSHARE_FAKENVIDIA_MOCK_H

#include <limits.h>
#include <pthread.h>
#include <stddef.h>

#include "nvml_abi.h"

/* As many GPUs as the largest single nodes have (HGX-2: 16); bounds every table below. */
#define MOCK_MAX_GPUS 16
/* The device plugin holds one event set per resource it serves; 64 leaves room for restarts. */
#define MOCK_MAX_EVENT_SETS 64
#define MOCK_UUID_SEED_SIZE 64

/* What the mock's GPUs accept for registration: ECC, P-state, XID and clock events (only XIDs are ever fired). */
#define MOCK_SUPPORTED_EVENT_TYPES                                                                             \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |                   \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

/* Environment variables a test (or whoever starts the callers) sets. */
#define MOCK_CONFIG_ENV "GPUSHARE_MOCK_NVML_CONFIG"
#define MOCK_EVENTS_ENV "GPUSHARE_MOCK_NVML_EVENTS"
/* Read from the library's own directory when MOCK_CONFIG_ENV is unset (config.c says why). */
#define MOCK_SIDECAR_CONFIG_NAME "gpushare-mock-nvml.conf"

struct mock_config {
    unsigned int count;
    char names[MOCK_MAX_GPUS][NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned long long memory_mib;
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda_driver_version;
    char uuid_seed[MOCK_UUID_SEED_SIZE];
    char events_dir[PATH_MAX]; /* empty: no events are ever delivered */
};

struct nvmlDevice_st {
    unsigned int index;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    unsigned int pci_bus;
    unsigned long long memory_total;
};

struct nvmlEventSet_st {
    int in_use;
    /* Bumped on every create and free, so a waiter can tell its set from a later one in the same slot. */
    unsigned long long generation;
    unsigned long long registered[MOCK_MAX_GPUS]; /* event type mask per GPU index */
};

struct mock_state {
    unsigned int init_count;
    struct mock_config config;
    struct nvmlDevice_st devices[MOCK_MAX_GPUS];
    struct nvmlEventSet_st event_sets[MOCK_MAX_EVENT_SETS];
};

/* Both guarded by mock_lock. */
extern pthread_mutex_t mock_lock;
extern struct mock_state mock;

/*
 * Takes mock_lock and returns NVML_SUCCESS if the library is initialized; otherwise releases it
 * and returns NVML_ERROR_UNINITIALIZED. Every entry point that needs nvmlInit starts with it.
 */
nvmlReturn_t mock_enter(void);
void mock_leave(void);

/* The device a handle names, or NULL for a handle this initialization never handed out. Under mock_lock. */
struct nvmlDevice_st *mock_device(nvmlDevice_t handle);

/* Copies src into dst of dst_size bytes; NVML_ERROR_INSUFFICIENT_SIZE if it does not fit with its NUL. */
nvmlReturn_t mock_copy_string(char *dst, unsigned int dst_size, const char *src);

/* config.c: a whole decimal number up to max: digits only (no sign, space or base prefix), nothing after them. */
int mock_parse_uint(const char *text, unsigned long long max, unsigned long long *out);
/* config.c: s without leading and trailing blanks (and a trailing CR), trimmed in place. */
char *mock_trim(char *s);

/* config.c: fills *config from defaults, the config file and the environment. Returns 0, or -1 with err set. */
int mock_config_load(struct mock_config *config, char *err, size_t err_size);

/* devices.c: the device table for a loaded config. Under mock_lock. */
void mock_devices_build(const struct mock_config *config, struct nvmlDevice_st *devices);

/* events.c: forgets every event set; at the last nvmlShutdown. Under mock_lock. */
void mock_event_sets_reset(void);

#endif
