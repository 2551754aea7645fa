/*
 * Initialization, shutdown, error strings and the system-wide queries of the mock NVML.
 *
 * nvmlInit_v2 is reference counted as NVIDIA documents it: the first call loads the configuration
 * and builds the GPUs, later calls only count, and the GPUs and event sets go away at the
 * nvmlShutdown that brings the count back to zero. go-nvml calls nvmlInit_v2/nvmlShutdown in pairs
 * around each piece of work, while the device plugin's health check holds one initialization for
 * as long as it watches events.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mock.h"

/* The struct layouts callers compiled against nvml.h expect (x86_64 and aarch64, LP64). */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t size");
_Static_assert(offsetof(nvmlPciInfo_t, domain) == 16, "nvmlPciInfo_t.domain offset");
_Static_assert(offsetof(nvmlPciInfo_t, pciSubSystemId) == 32, "nvmlPciInfo_t.pciSubSystemId offset");
_Static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t.busId offset");
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t size");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t size");
_Static_assert(offsetof(nvmlEventData_t, eventData) == 16, "nvmlEventData_t.eventData offset");
_Static_assert(offsetof(nvmlEventData_t, computeInstanceId) == 28, "nvmlEventData_t.computeInstanceId offset");
_Static_assert(sizeof(nvmlDevice_t) == sizeof(void *), "a device handle is one pointer");
_Static_assert(sizeof(nvmlReturn_t) == 4, "nvmlReturn_t is an int");

pthread_mutex_t mock_lock = PTHREAD_MUTEX_INITIALIZER;
struct mock_state mock;

nvmlReturn_t mock_enter(void)
{
    pthread_mutex_lock(&mock_lock);
    if (mock.init_count == 0) {
        pthread_mutex_unlock(&mock_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    return NVML_SUCCESS;
}

void mock_leave(void)
{
    pthread_mutex_unlock(&mock_lock);
}

struct nvmlDevice_st *mock_device(nvmlDevice_t handle)
{
    /* Compared as integers: a caller may pass any bit pattern, and only our own addresses are handles. */
    uintptr_t wanted = (uintptr_t)handle;
    for (unsigned int i = 0; i < mock.config.count; i++) {
        if ((uintptr_t)&mock.devices[i] == wanted) {
            return &mock.devices[i];
        }
    }
    return NULL;
}

nvmlReturn_t mock_copy_string(char *dst, unsigned int dst_size, const char *src)
{
    size_t needed = strlen(src) + 1;
    if (needed > dst_size) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(dst, src, needed);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    /* Only touched under mock_lock; static to keep a few KiB off cgo's thread stacks. */
    static struct mock_config loading;
    char err[512];
    nvmlReturn_t ret = NVML_SUCCESS;

    pthread_mutex_lock(&mock_lock);
    if (mock.init_count == 0) {
        if (mock_config_load(&loading, err, sizeof(err)) != 0) {
            /* The real library logs nothing; a fake that refuses its config must say why. */
            fprintf(stderr, "gpushare mock NVML: nvmlInit_v2 failed: %s\n", err);
            ret = NVML_ERROR_UNKNOWN;
        } else {
            mock.config = loading;
            mock_devices_build(&mock.config, mock.devices);
        }
    }
    if (ret == NVML_SUCCESS) {
        mock.init_count++;
    }
    pthread_mutex_unlock(&mock_lock);
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    mock.init_count--;
    if (mock.init_count == 0) {
        mock_event_sets_reset();
    }
    mock_leave();
    return NVML_SUCCESS;
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (version == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        ret = mock_copy_string(version, length, mock.config.driver_version);
    }
    mock_leave();
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (cudaDriverVersion == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        *cudaDriverVersion = mock.config.cuda_driver_version;
    }
    mock_leave();
    return ret;
}

