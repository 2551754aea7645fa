/*
 * The GPUs the mock reports, and every per-device query its callers make.
 *
 * What one GPU looks like, unless the config says otherwise: an A100-SXM4-40GB (Ampere, compute
 * capability 8.0, 40960 MiB, PCI device 0x20B0 of vendor 0x10DE, sub-system 0x134F), MIG capable
 * but with MIG disabled, no NVLink, at PCI address 00000000:<07 + 16*index>:00.0, with minor
 * number = index (so its node is /dev/nvidia<index>) and a UUID that depends only on the uuid_seed
 * and the index, so it is the same in every process and every run.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mock.h"

#define PCI_DEVICE_ID 0x20B010DEU  /* A100-SXM4-40GB: device id 0x20B0, vendor id 0x10DE */
#define PCI_SUBSYSTEM_ID 0x134F10DEU
#define FIRST_PCI_BUS 0x07U
#define PCI_BUS_STRIDE 0x10U /* 16 GPUs end at bus 0xF7 */
#define CUDA_CC_MAJOR 8
#define CUDA_CC_MINOR 0
/* Without MIG enabled there are no MIG devices, and NVML reports 0 as their maximum count. */
#define MAX_MIG_DEVICES_WITH_MIG_DISABLED 0U

_Static_assert(FIRST_PCI_BUS + PCI_BUS_STRIDE * (MOCK_MAX_GPUS - 1) <= 0xFF, "a PCI bus number is one byte");

static uint64_t fnv1a64(const char *text)
{
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)text; *p != '\0'; p++) {
        hash ^= *p;
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

/* splitmix64: spreads a seed and an index over all 128 bits of a UUID. */
static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void format_uuid(char *out, size_t size, const char *seed, unsigned int index)
{
    uint64_t state = fnv1a64(seed) ^ (uint64_t)index;
    uint64_t hi = splitmix64(&state);
    uint64_t lo = splitmix64(&state);
    snprintf(out, size, "GPU-%08x-%04x-%04x-%04x-%012llx", (unsigned int)(hi >> 32), (unsigned int)((hi >> 16) & 0xffffU),
             (unsigned int)(hi & 0xffffU), (unsigned int)(lo >> 48), (unsigned long long)(lo & 0xffffffffffffULL));
}

void mock_devices_build(const struct mock_config *config, struct nvmlDevice_st *devices)
{
    memset(devices, 0, sizeof(struct nvmlDevice_st) * MOCK_MAX_GPUS);
    for (unsigned int i = 0; i < config->count; i++) {
        struct nvmlDevice_st *d = &devices[i];
        d->index = i;
        memcpy(d->name, config->names[i], sizeof(d->name));
        format_uuid(d->uuid, sizeof(d->uuid), config->uuid_seed, i);
        d->pci_bus = FIRST_PCI_BUS + PCI_BUS_STRIDE * i;
        d->memory_total = config->memory_mib * 1024ULL * 1024ULL;
    }
}

static void fill_pci_info(const struct nvmlDevice_st *d, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof(*pci));
    pci->domain = 0;
    pci->bus = d->pci_bus;
    pci->device = 0;
    pci->pciDeviceId = PCI_DEVICE_ID;
    pci->pciSubSystemId = PCI_SUBSYSTEM_ID;
    /* NVIDIA's formats: NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT and NVML_DEVICE_PCI_BUS_ID_FMT. */
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
}

/*
 * Every per-device query starts here: library initialized, handle valid, out-pointers non-NULL.
 * On NVML_SUCCESS mock_lock is held and *device is set, and the caller answers and calls
 * mock_leave; on any error the lock is already released and the caller returns the error.
 */
static nvmlReturn_t enter_device(nvmlDevice_t handle, int outputs_valid, const struct nvmlDevice_st **device)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *device = mock_device(handle);
    if (*device == NULL || !outputs_valid) {
        mock_leave();
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

/* For the queries whose answer is an error for every valid device. */
static nvmlReturn_t answer_for_every_device(nvmlDevice_t handle, int outputs_valid, nvmlReturn_t answer)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(handle, outputs_valid, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    mock_leave();
    return answer;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (deviceCount == NULL) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        *deviceCount = mock.config.count;
    }
    mock_leave();
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    if (device == NULL || index >= mock.config.count) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        *device = &mock.devices[index];
    }
    mock_leave();
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t ret = mock_enter();
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    /* NVML takes GPU and MIG UUIDs here; anything else is not a UUID at all. */
    if (uuid == NULL || device == NULL || (strncmp(uuid, "GPU-", 4) != 0 && strncmp(uuid, "MIG-", 4) != 0)) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        ret = NVML_ERROR_NOT_FOUND;
        for (unsigned int i = 0; i < mock.config.count; i++) {
            if (strncmp(uuid, mock.devices[i].uuid, sizeof(mock.devices[i].uuid)) == 0) {
                *device = &mock.devices[i];
                ret = NVML_SUCCESS;
                break;
            }
        }
    }
    mock_leave();
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, name != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    ret = mock_copy_string(name, length, d->name);
    mock_leave();
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, uuid != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    ret = mock_copy_string(uuid, length, d->uuid);
    mock_leave();
    return ret;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, index != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *index = d->index;
    mock_leave();
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, minorNumber != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *minorNumber = d->index;
    mock_leave();
    return NVML_SUCCESS;
}

/* An idle GPU: nothing allocated and, for this fake, nothing reserved by the driver either. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, memory != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    memory->total = d->memory_total;
    memory->free = d->memory_total;
    memory->used = 0;
    mock_leave();
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, pci != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    fill_pci_info(d, pci);
    mock_leave();
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, type != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *type = NVML_BRAND_NVIDIA;
    mock_leave();
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, arch != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *arch = NVML_DEVICE_ARCH_AMPERE;
    mock_leave();
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, major != NULL && minor != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *major = CUDA_CC_MAJOR;
    *minor = CUDA_CC_MINOR;
    mock_leave();
    return NVML_SUCCESS;
}

/* MIG capable (as an A100 is) and disabled: go-nvlib then asks for MIG devices and finds none. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, currentMode != NULL && pendingMode != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *currentMode = NVML_DEVICE_MIG_DISABLE;
    *pendingMode = NVML_DEVICE_MIG_DISABLE;
    mock_leave();
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, count != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *count = MAX_MIG_DEVICES_WITH_MIG_DISABLED;
    mock_leave();
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                             nvmlDevice_t *migDevice)
{
    (void)index; /* with MIG disabled no index holds a MIG device */
    return answer_for_every_device(device, migDevice != NULL, NVML_ERROR_NOT_FOUND);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, isMigDevice != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *isMigDevice = 0;
    mock_leave();
    return NVML_SUCCESS;
}

/* No MIG profiles are simulated: go-nvlib skips a profile that answers NOT_SUPPORTED. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                             nvmlGpuInstanceProfileInfo_t *info)
{
    nvmlReturn_t answer = profile < NVML_GPU_INSTANCE_PROFILE_COUNT ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return answer_for_every_device(device, info != NULL, answer);
}

/*
 * A two-socket box of PCIe switches: GPUs 2k and 2k+1 share a switch, GPUs 0-3 and 4-7 (and so on)
 * a CPU socket. go-gpuallocator reads this for the device plugin's preferred allocations.
 */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                             nvmlGpuTopologyLevel_t *pathInfo)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device1, pathInfo != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    const struct nvmlDevice_st *other = mock_device(device2);
    if (other == NULL || other == d) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (d->index / 2 == other->index / 2) {
        *pathInfo = NVML_TOPOLOGY_SINGLE;
    } else if (d->index / 4 == other->index / 4) {
        *pathInfo = NVML_TOPOLOGY_NODE;
    } else {
        *pathInfo = NVML_TOPOLOGY_SYSTEM;
    }
    mock_leave();
    return ret;
}

/* No NVLink is simulated; go-gpuallocator skips links that answer NOT_SUPPORTED. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    nvmlReturn_t answer = link < NVML_NVLINK_MAX_LINKS ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return answer_for_every_device(device, isActive != NULL, answer);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    const struct nvmlDevice_st *d;
    nvmlReturn_t ret = enter_device(device, eventTypes != NULL, &d);
    if (ret != NVML_SUCCESS) {
        return ret;
    }
    *eventTypes = MOCK_SUPPORTED_EVENT_TYPES;
    mock_leave();
    return NVML_SUCCESS;
}
