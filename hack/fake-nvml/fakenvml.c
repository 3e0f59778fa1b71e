/*
 * fakenvml.c: a stand-in for the NVIDIA Management Library (libnvidia-ml.so.1) that serves a
 * recorded machine from a plain-text shape file, so that gpuslice's NVML agent backend
 * (src/gpuslice/agent/nvml.py, through nvidia-ml-py) runs unchanged on a machine without a GPU.
 *
 * Written from the public NVML API reference (https://docs.nvidia.com/deploy/nvml-api/): the
 * function names and signatures, the return codes, and the layouts of nvmlPciInfo_t,
 * nvmlMemory_t, nvmlUtilization_t and nvmlEventData_t as nvml.h declares them. Only the calls the
 * agent makes are here; nvidia-ml-py raises NVMLError_FunctionNotFound for any other.
 *
 *   gcc -shared -fPIC -O2 -Wall -Wextra -Werror -o libnvidia-ml.so.1 fakenvml.c
 *   GPUSLICE_FAKE_NVML_SHAPE=machine.shape LD_LIBRARY_PATH=<dir> gpuslice agent --backend nvml
 *
 * The shape file is read at the first nvmlInit. Lines are "keyword arguments..."; blank lines and
 * lines starting with '#' are ignored; '-' stands for "the card does not support this call"
 * (NVML_ERROR_NOT_SUPPORTED). Numbers are decimal or 0x-hex.
 *
 *   gpuslice-fake-nvml 1                  first line: format and version
 *   driver VERSION | nvml VERSION         nvmlSystemGetDriverVersion / GetNVMLVersion ("fake")
 *   init-error CODE                       nvmlInit returns CODE (e.g. 9, driver not loaded)
 *   device INDEX                          starts card INDEX (0, 1, 2, ... in order); the lines
 *                                         below, up to the next "device", describe it:
 *     uuid UUID                           required
 *     name TEXT...                        required; the rest of the line
 *     bus DOMAIN:BB:DD.F                  required; PCI bus id (4 or 8 hex digits of domain)
 *     memory TOTAL_MIB USED_MIB           required
 *     numa N|-                            NUMA node near the card (nvmlDeviceGetMemoryAffinity)
 *     gpu-numa N|-                        the card's own NUMA node (nvmlDeviceGetNumaNodeId,
 *                                         coherent platforms only; default -)
 *     mig 0|1|-                           current MIG mode
 *     pcie GEN WIDTH MAXGEN MAXWIDTH      each a number or -
 *     arch N|-                            nvmlDeviceArchitecture_t
 *     temperature C|-                     degrees C
 *     power MW|- | power-limit MW|-       milliwatts (usage, enforced limit)
 *     utilization GPU MEM | -             percent
 *     events MASK|-                       supported event types (default XID, ECC, poison,
 *                                         GPU unavailable)
 *     nvlink LINK BUS TYPE VERSION        an active link: far end's bus id, gpu|ibmnpu|switch|
 *                                         unknown|-, nvmlNvlinkVersion_t or -; links below the
 *                                         highest one given are inactive, those above invalid
 *     mig-profile INDEX ID NAME SLICES SMS MIB SIZE@START,START,...
 *                                         a GPU-instance profile of a card in MIG mode:
 *                                         NVML_GPU_INSTANCE_PROFILE_* INDEX, the profile's ID,
 *                                         name (without "MIG "), compute slices, SMs, memory and
 *                                         its possible placements (instance count = their number)
 *   pair A B LEVEL READ WRITE             common ancestor (nvmlGpuTopologyLevel_t) and P2P
 *                                         read/write status of cards A and B, each a number or -
 *   event DEVICE|- KIND DATA AFTER_MS     queued for nvmlEventSetWait AFTER_MS after the event
 *                                         set was created, delivered if DEVICE registered KIND:
 *                                         xid, double-bit-ecc, single-bit-ecc, gpu-unavailable,
 *                                         fatal-poison or a mask; DATA is the XID
 *
 * A file that does not parse makes nvmlInit return NVML_ERROR_UNKNOWN, with the reason on stderr
 * ("fake-nvml: FILE:LINE: ..."); no environment variable or an unreadable file gives
 * NVML_ERROR_DRIVER_NOT_LOADED. All state is static and guarded by one mutex, so a thread blocked
 * in nvmlEventSetWait while another calls nvmlShutdown sees NVML_ERROR_UNINITIALIZED, never freed
 * memory.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the public NVML types this library serves (nvml.h) ---- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_UNKNOWN = 999
};

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct {
    unsigned int start;
    unsigned int size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96]; /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
} nvmlGpuInstanceProfileInfo_v2_t;

#define NVML_TEMPERATURE_GPU 0u
#define NVML_AFFINITY_SCOPE_SOCKET 1u
#define NVML_P2P_CAPS_INDEX_READ 0u
#define NVML_P2P_CAPS_INDEX_WRITE 1u
#define NVML_TOPOLOGY_INTERNAL 0u
#define PCI_VENDOR_NVIDIA 0x10DEu

#define EVENT_SINGLE_BIT_ECC 0x0001ull
#define EVENT_DOUBLE_BIT_ECC 0x0002ull
#define EVENT_XID 0x0008ull
#define EVENT_FATAL_POISON 0x2000ull
#define EVENT_GPU_UNAVAILABLE 0x4000ull
#define EVENT_DEFAULT_SUPPORTED \
    (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID | EVENT_FATAL_POISON | EVENT_GPU_UNAVAILABLE)

/* ---- the machine ---- */

#define MAX_DEVICES 64
#define MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS */
#define MAX_EVENTS 256
#define MAX_SETS 16
#define MAX_LINE 1024
#define MAX_TOKENS 8
#define TEXT_SIZE 96 /* NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define VERSION_SIZE 80 /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define MAX_NUMA_NODE 1023
#define MAX_MEMORY_MIB (1ull << 40)
#define WAIT_STEP_MS 10
#define MAX_MIG_PROFILES 16
#define MAX_PLACEMENTS 8

struct mig_profile {
    unsigned int index, id, slices, sms, size, count;
    unsigned long long memory_mib;
    char name[TEXT_SIZE - 4]; /* NVML's name is "MIG " and this */
    unsigned int starts[MAX_PLACEMENTS];
};

typedef struct {
    int supported;
    unsigned int value;
} opt_uint;

typedef struct {
    unsigned int domain, bus, device, function;
} bus_id;

struct link {
    int declared;
    bus_id remote;
    opt_uint type;
    opt_uint version;
};

struct nvmlDevice_st {
    unsigned int seen; /* attribute lines given, one bit each (duplicates are errors) */
    char uuid[TEXT_SIZE];
    char name[TEXT_SIZE];
    bus_id bus;
    unsigned long long total_mib, used_mib;
    opt_uint numa, gpu_numa, mig, pcie[4], arch, temperature, power_mw, power_limit_mw;
    int util_supported;
    unsigned int util_gpu, util_memory;
    int events_supported;
    unsigned long long event_types;
    unsigned int link_count; /* highest declared link + 1; 0 = no NVLink */
    struct link links[MAX_LINKS];
    unsigned int mig_profile_count;
    struct mig_profile mig_profiles[MAX_MIG_PROFILES];
};

struct pair {
    int declared;
    opt_uint level, read, write;
};

struct event {
    int device; /* -1: no device named */
    unsigned long long type, data, after_ms;
    int delivered;
};

struct nvmlEventSet_st {
    int in_use;
    unsigned long long created_ms;
    unsigned long long registered[MAX_DEVICES];
};

struct machine {
    unsigned int count;
    char driver[VERSION_SIZE];
    char nvml[VERSION_SIZE];
    nvmlReturn_t init_error;
    struct nvmlDevice_st devices[MAX_DEVICES];
    struct pair pairs[MAX_DEVICES][MAX_DEVICES];
    unsigned int event_count;
    struct event events[MAX_EVENTS];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refs; /* nvmlInit calls not yet matched by nvmlShutdown */
static struct machine g;
static struct nvmlEventSet_st g_sets[MAX_SETS];

static unsigned long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000ull + (unsigned long long)ts.tv_nsec / 1000000ull;
}

/* ---- parsing ---- */

enum attr {
    A_UUID, A_NAME, A_BUS, A_MEMORY, A_NUMA, A_GPU_NUMA, A_MIG, A_PCIE, A_ARCH, A_TEMPERATURE,
    A_POWER, A_POWER_LIMIT, A_UTILIZATION, A_EVENTS
};

struct parser {
    const char *path;
    unsigned int line_no;
    int have_header;
    struct nvmlDevice_st *current;
    char error[256];
};

static int fail(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct parser *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->error, sizeof p->error, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_number(const char *s, unsigned long long max, unsigned long long *out)
{
    int base = 10;
    unsigned long long v = 0;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    if (*s == '\0')
        return -1;
    for (; *s; s++) {
        unsigned int digit;
        if (*s >= '0' && *s <= '9')
            digit = (unsigned int)(*s - '0');
        else if (base == 16 && *s >= 'a' && *s <= 'f')
            digit = (unsigned int)(*s - 'a' + 10);
        else if (base == 16 && *s >= 'A' && *s <= 'F')
            digit = (unsigned int)(*s - 'A' + 10);
        else
            return -1;
        if (v > (ULLONG_MAX - digit) / (unsigned long long)base)
            return -1;
        v = v * (unsigned long long)base + digit;
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_uint(struct parser *p, const char *what, const char *s, unsigned long long max,
                      unsigned long long *out)
{
    if (parse_number(s, max, out) != 0)
        return fail(p, "%s: expected a number from 0 to %llu, got '%s'", what, max, s);
    return 0;
}

static int parse_opt(struct parser *p, const char *what, const char *s, unsigned long long max, opt_uint *out)
{
    unsigned long long v;
    if (strcmp(s, "-") == 0) {
        out->supported = 0;
        out->value = 0;
        return 0;
    }
    if (parse_uint(p, what, s, max, &v) != 0)
        return -1;
    out->supported = 1;
    out->value = (unsigned int)v;
    return 0;
}

static int hex_field(const char *s, size_t len, unsigned int *out)
{
    unsigned long long v = 0;
    char buf[9];
    if (len == 0 || len > 8)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return -1;
    }
    v = strtoull(buf, NULL, 16);
    *out = (unsigned int)v;
    return 0;
}

/* DOMAIN:BB:DD.F with a domain of 4 or 8 hex digits. */
static int parse_bus(struct parser *p, const char *s, bus_id *out)
{
    const char *c1 = strchr(s, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    const char *dot = c2 ? strchr(c2 + 1, '.') : NULL;
    size_t dlen = c1 ? (size_t)(c1 - s) : 0;
    if (!dot || (dlen != 4 && dlen != 8) || c2 - c1 != 3 || dot - c2 != 3 || strlen(dot + 1) != 1 ||
        hex_field(s, dlen, &out->domain) != 0 || hex_field(c1 + 1, 2, &out->bus) != 0 ||
        hex_field(c2 + 1, 2, &out->device) != 0 || hex_field(dot + 1, 1, &out->function) != 0 ||
        out->device > 0x1F || out->function > 7)
        return fail(p, "expected a PCI bus id DOMAIN:BB:DD.F, got '%s'", s);
    return 0;
}

static int parse_text(struct parser *p, const char *what, const char *s, char *out, size_t size)
{
    size_t len = strlen(s);
    if (len == 0 || len >= size)
        return fail(p, "%s: expected 1 to %zu characters", what, size - 1);
    memcpy(out, s, len + 1);
    return 0;
}

static const struct {
    const char *name;
    unsigned long long mask;
} EVENT_KINDS[] = {
    {"xid", EVENT_XID},
    {"double-bit-ecc", EVENT_DOUBLE_BIT_ECC},
    {"single-bit-ecc", EVENT_SINGLE_BIT_ECC},
    {"gpu-unavailable", EVENT_GPU_UNAVAILABLE},
    {"fatal-poison", EVENT_FATAL_POISON},
};

static const struct {
    const char *name;
    unsigned int value;
} LINK_TYPES[] = {{"gpu", 0}, {"ibmnpu", 1}, {"switch", 2}, {"unknown", 0xFF}};

static int want_args(struct parser *p, const char *keyword, int ntok, int wanted)
{
    if (ntok != wanted + 1)
        return fail(p, "%s takes %d argument%s, got %d", keyword, wanted, wanted == 1 ? "" : "s", ntok - 1);
    return 0;
}

static int device_attr(struct parser *p, const char *keyword, enum attr a)
{
    if (p->current == NULL)
        return fail(p, "'%s' before any 'device' line", keyword);
    if (p->current->seen & (1u << a))
        return fail(p, "'%s' given twice for this device", keyword);
    p->current->seen |= 1u << a;
    return 0;
}

static int parse_nvlink(struct parser *p, char **tok, int ntok)
{
    struct nvmlDevice_st *d = p->current;
    unsigned long long link;
    struct link *l;
    if (d == NULL)
        return fail(p, "'nvlink' before any 'device' line");
    if (want_args(p, "nvlink", ntok, 4) != 0 || parse_uint(p, "nvlink link", tok[1], MAX_LINKS - 1, &link) != 0)
        return -1;
    l = &d->links[link];
    if (l->declared)
        return fail(p, "nvlink %llu given twice for this device", link);
    if (parse_bus(p, tok[2], &l->remote) != 0)
        return -1;
    l->type.supported = 0;
    if (strcmp(tok[3], "-") != 0) {
        size_t i;
        for (i = 0; i < sizeof LINK_TYPES / sizeof LINK_TYPES[0]; i++)
            if (strcmp(tok[3], LINK_TYPES[i].name) == 0)
                break;
        if (i == sizeof LINK_TYPES / sizeof LINK_TYPES[0])
            return fail(p, "nvlink type: expected gpu, ibmnpu, switch, unknown or -, got '%s'", tok[3]);
        l->type.supported = 1;
        l->type.value = LINK_TYPES[i].value;
    }
    if (parse_opt(p, "nvlink version", tok[4], 255, &l->version) != 0)
        return -1;
    l->declared = 1;
    if (link + 1 > d->link_count)
        d->link_count = (unsigned int)link + 1;
    return 0;
}

static int parse_pair(struct parser *p, char **tok, int ntok)
{
    unsigned long long a, b;
    struct pair *pr;
    if (want_args(p, "pair", ntok, 5) != 0 || parse_uint(p, "pair A", tok[1], MAX_DEVICES - 1, &a) != 0 ||
        parse_uint(p, "pair B", tok[2], MAX_DEVICES - 1, &b) != 0)
        return -1;
    if (a == b)
        return fail(p, "pair of a card with itself");
    pr = &g.pairs[a][b];
    if (pr->declared)
        return fail(p, "pair %llu %llu given twice", a, b);
    if (parse_opt(p, "pair level", tok[3], 50, &pr->level) != 0 ||
        parse_opt(p, "pair read", tok[4], 6, &pr->read) != 0 || parse_opt(p, "pair write", tok[5], 6, &pr->write) != 0)
        return -1;
    if (pr->level.supported && pr->level.value % 10 != 0)
        return fail(p, "pair level: expected 0, 10, 20, 30, 40 or 50, got %u", pr->level.value);
    pr->declared = 1;
    return 0;
}

static int parse_event(struct parser *p, char **tok, int ntok)
{
    struct event *e;
    unsigned long long device;
    size_t i;
    if (want_args(p, "event", ntok, 4) != 0)
        return -1;
    if (g.event_count == MAX_EVENTS)
        return fail(p, "more than %d events", MAX_EVENTS);
    e = &g.events[g.event_count];
    e->device = -1;
    if (strcmp(tok[1], "-") != 0) {
        if (parse_uint(p, "event device", tok[1], MAX_DEVICES - 1, &device) != 0)
            return -1;
        e->device = (int)device;
    }
    for (i = 0; i < sizeof EVENT_KINDS / sizeof EVENT_KINDS[0]; i++)
        if (strcmp(tok[2], EVENT_KINDS[i].name) == 0)
            break;
    if (i < sizeof EVENT_KINDS / sizeof EVENT_KINDS[0])
        e->type = EVENT_KINDS[i].mask;
    else if (parse_number(tok[2], ULLONG_MAX, &e->type) != 0 || e->type == 0)
        return fail(p, "event kind: expected xid, double-bit-ecc, single-bit-ecc, gpu-unavailable, "
                       "fatal-poison or a non-zero mask, got '%s'", tok[2]);
    if (parse_uint(p, "event data", tok[3], ULLONG_MAX, &e->data) != 0 ||
        parse_uint(p, "event delay", tok[4], 86400000ull, &e->after_ms) != 0)
        return -1;
    g.event_count++;
    return 0;
}

/* mig-profile INDEX ID NAME SLICES SMS MIB SIZE@START,START,... */
static int parse_mig_profile(struct parser *p, char **tok, int ntok)
{
    struct nvmlDevice_st *d = p->current;
    struct mig_profile *m;
    unsigned long long index, id, slices, sms, mib, size, start;
    char buf[MAX_LINE], *at, *item, *save = NULL;
    if (d == NULL)
        return fail(p, "'mig-profile' before any 'device' line");
    if (want_args(p, "mig-profile", ntok, 7) != 0)
        return -1;
    if (d->mig_profile_count >= MAX_MIG_PROFILES)
        return fail(p, "more than %d MIG profiles on one device", MAX_MIG_PROFILES);
    m = &d->mig_profiles[d->mig_profile_count];
    if (parse_uint(p, "mig-profile index", tok[1], 63, &index) || parse_uint(p, "mig-profile id", tok[2], UINT_MAX, &id) ||
        parse_text(p, "mig-profile name", tok[3], m->name, TEXT_SIZE - 4) ||
        parse_uint(p, "mig-profile slices", tok[4], 8, &slices) || parse_uint(p, "mig-profile sms", tok[5], UINT_MAX, &sms) ||
        parse_uint(p, "mig-profile memory", tok[6], MAX_MEMORY_MIB, &mib))
        return -1;
    for (unsigned int k = 0; k < d->mig_profile_count; k++)
        if (d->mig_profiles[k].index == index || d->mig_profiles[k].id == id)
            return fail(p, "mig-profile %llu (id %llu) given twice for this device", index, id);
    strcpy(buf, tok[7]);
    at = strchr(buf, '@');
    if (at == NULL)
        return fail(p, "mig-profile placements: expected SIZE@START,START,...");
    *at = '\0';
    if (parse_uint(p, "mig-profile size", buf, 8, &size) != 0 || size == 0)
        return size == 0 ? fail(p, "mig-profile size must be 1 to 8") : -1;
    m->count = 0;
    for (item = strtok_r(at + 1, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        if (m->count >= MAX_PLACEMENTS)
            return fail(p, "more than %d placements of one MIG profile", MAX_PLACEMENTS);
        if (parse_uint(p, "mig-profile start", item, 7, &start) != 0)
            return -1;
        m->starts[m->count++] = (unsigned int)start;
    }
    if (m->count == 0)
        return fail(p, "mig-profile without a placement");
    m->index = (unsigned int)index;
    m->id = (unsigned int)id;
    m->slices = (unsigned int)slices;
    m->sms = (unsigned int)sms;
    m->memory_mib = mib;
    m->size = (unsigned int)size;
    d->mig_profile_count++;
    return 0;
}

static int parse_device_line(struct parser *p, char **tok, int ntok)
{
    unsigned long long index;
    if (want_args(p, "device", ntok, 1) != 0 || parse_uint(p, "device", tok[1], MAX_DEVICES - 1, &index) != 0)
        return -1;
    if (index != g.count)
        return fail(p, "device %llu out of order: expected device %u", index, g.count);
    p->current = &g.devices[g.count++];
    p->current->events_supported = 1;
    p->current->event_types = EVENT_DEFAULT_SUPPORTED;
    return 0;
}

/* One line, split into tokens; "rest" is the text after the keyword (for "name"). */
static int parse_tokens(struct parser *p, char **tok, int ntok, const char *rest)
{
    struct nvmlDevice_st *d = p->current;
    const char *k = tok[0];
    unsigned long long v, w;
    if (!p->have_header) {
        if (strcmp(k, "gpuslice-fake-nvml") != 0 || ntok != 2 || strcmp(tok[1], "1") != 0)
            return fail(p, "the first line must be 'gpuslice-fake-nvml 1'");
        p->have_header = 1;
        return 0;
    }
    if (strcmp(k, "driver") == 0 || strcmp(k, "nvml") == 0)
        return want_args(p, k, ntok, 1) ? -1 : parse_text(p, k, tok[1], k[0] == 'd' ? g.driver : g.nvml, VERSION_SIZE);
    if (strcmp(k, "init-error") == 0) {
        if (want_args(p, k, ntok, 1) != 0 || parse_uint(p, k, tok[1], 999, &v) != 0)
            return -1;
        g.init_error = (nvmlReturn_t)v;
        return 0;
    }
    if (strcmp(k, "device") == 0)
        return parse_device_line(p, tok, ntok);
    if (strcmp(k, "nvlink") == 0)
        return parse_nvlink(p, tok, ntok);
    if (strcmp(k, "pair") == 0)
        return parse_pair(p, tok, ntok);
    if (strcmp(k, "event") == 0)
        return parse_event(p, tok, ntok);
    if (strcmp(k, "mig-profile") == 0)
        return parse_mig_profile(p, tok, ntok);
    if (strcmp(k, "name") == 0) {
        if (device_attr(p, k, A_NAME) != 0)
            return -1;
        return parse_text(p, k, rest, p->current->name, TEXT_SIZE);
    }
    if (strcmp(k, "uuid") == 0)
        return device_attr(p, k, A_UUID) || want_args(p, k, ntok, 1) ? -1 : parse_text(p, k, tok[1], d->uuid, TEXT_SIZE);
    if (strcmp(k, "bus") == 0)
        return device_attr(p, k, A_BUS) || want_args(p, k, ntok, 1) ? -1 : parse_bus(p, tok[1], &d->bus);
    if (strcmp(k, "memory") == 0) {
        if (device_attr(p, k, A_MEMORY) || want_args(p, k, ntok, 2) ||
            parse_uint(p, "memory total", tok[1], MAX_MEMORY_MIB, &v) ||
            parse_uint(p, "memory used", tok[2], MAX_MEMORY_MIB, &w))
            return -1;
        if (w > v)
            return fail(p, "memory: %llu MiB used of %llu MiB", w, v);
        d->total_mib = v;
        d->used_mib = w;
        return 0;
    }
    if (strcmp(k, "pcie") == 0) {
        if (device_attr(p, k, A_PCIE) || want_args(p, k, ntok, 4))
            return -1;
        for (int i = 0; i < 4; i++)
            if (parse_opt(p, "pcie", tok[i + 1], 64, &d->pcie[i]) != 0)
                return -1;
        return 0;
    }
    if (strcmp(k, "utilization") == 0) {
        if (device_attr(p, k, A_UTILIZATION))
            return -1;
        if (ntok == 2 && strcmp(tok[1], "-") == 0) {
            d->util_supported = 0;
            return 0;
        }
        if (want_args(p, k, ntok, 2) || parse_uint(p, "utilization gpu", tok[1], 100, &v) ||
            parse_uint(p, "utilization memory", tok[2], 100, &w))
            return -1;
        d->util_supported = 1;
        d->util_gpu = (unsigned int)v;
        d->util_memory = (unsigned int)w;
        return 0;
    }
    if (strcmp(k, "events") == 0) {
        if (device_attr(p, k, A_EVENTS) || want_args(p, k, ntok, 1))
            return -1;
        d->events_supported = strcmp(tok[1], "-") != 0;
        d->event_types = 0;
        return d->events_supported ? parse_uint(p, k, tok[1], ULLONG_MAX, &d->event_types) : 0;
    }
    {
        static const struct {
            const char *keyword;
            enum attr attr;
            size_t offset;
            unsigned long long max;
        } SIMPLE[] = {
            {"numa", A_NUMA, offsetof(struct nvmlDevice_st, numa), MAX_NUMA_NODE},
            {"gpu-numa", A_GPU_NUMA, offsetof(struct nvmlDevice_st, gpu_numa), MAX_NUMA_NODE},
            {"mig", A_MIG, offsetof(struct nvmlDevice_st, mig), 1},
            {"arch", A_ARCH, offsetof(struct nvmlDevice_st, arch), 0xFFFF},
            {"temperature", A_TEMPERATURE, offsetof(struct nvmlDevice_st, temperature), 1000},
            {"power", A_POWER, offsetof(struct nvmlDevice_st, power_mw), UINT_MAX},
            {"power-limit", A_POWER_LIMIT, offsetof(struct nvmlDevice_st, power_limit_mw), UINT_MAX},
        };
        for (size_t i = 0; i < sizeof SIMPLE / sizeof SIMPLE[0]; i++) {
            if (strcmp(k, SIMPLE[i].keyword) != 0)
                continue;
            if (device_attr(p, k, SIMPLE[i].attr) || want_args(p, k, ntok, 1))
                return -1;
            return parse_opt(p, k, tok[1], SIMPLE[i].max, (opt_uint *)(void *)((char *)d + SIMPLE[i].offset));
        }
    }
    return fail(p, "unknown keyword '%s'", k);
}

static int parse_line(struct parser *p, char *line, size_t len)
{
    char *tok[MAX_TOKENS];
    const char *rest = "";
    int ntok = 0;
    char *s = line;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
        line[--len] = '\0';
    if (len >= MAX_LINE)
        return fail(p, "line longer than %d characters", MAX_LINE - 1);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)line[i];
        if ((c < 0x20 && c != '\t') || c >= 0x7F)
            return fail(p, "character 0x%02X at column %zu (printable ASCII only)", c, i + 1);
    }
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '\0' || *s == '#')
        return 0;
    while (*s) {
        if (ntok == MAX_TOKENS)
            return fail(p, "more than %d words", MAX_TOKENS);
        tok[ntok++] = s;
        while (*s && *s != ' ' && *s != '\t')
            s++;
        if (ntok == 1) {
            const char *r = s;
            while (*r == ' ' || *r == '\t')
                r++;
            rest = r;
        }
        if (*s == '\0')
            break;
        if (ntok == 1 && s - tok[0] == 4 && strncmp(tok[0], "name", 4) == 0) {
            *s = '\0'; /* the name is the rest of the line, spaces and all */
            return parse_tokens(p, tok, 1, rest);
        }
        *s++ = '\0';
        while (*s == ' ' || *s == '\t')
            s++;
    }
    return parse_tokens(p, tok, ntok, rest);
}

static int check_machine(struct parser *p)
{
    static const char *const REQUIRED[] = {"uuid", "name", "bus", "memory"};
    static const enum attr REQUIRED_ATTR[] = {A_UUID, A_NAME, A_BUS, A_MEMORY};
    if (!p->have_header)
        return fail(p, "empty file: the first line must be 'gpuslice-fake-nvml 1'");
    for (unsigned int i = 0; i < g.count; i++)
        for (size_t r = 0; r < 4; r++)
            if (!(g.devices[i].seen & (1u << REQUIRED_ATTR[r])))
                return fail(p, "device %u has no '%s' line", i, REQUIRED[r]);
    for (unsigned int a = 0; a < MAX_DEVICES; a++)
        for (unsigned int b = 0; b < MAX_DEVICES; b++)
            if (g.pairs[a][b].declared && (a >= g.count || b >= g.count))
                return fail(p, "pair %u %u names a card that is not declared", a, b);
    for (unsigned int e = 0; e < g.event_count; e++)
        if (g.events[e].device >= (int)g.count)
            return fail(p, "event names card %d, which is not declared", g.events[e].device);
    return 0;
}

static nvmlReturn_t load_machine(void)
{
    const char *path = getenv("GPUSLICE_FAKE_NVML_SHAPE");
    struct parser p;
    FILE *f;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    memset(&g, 0, sizeof g);
    memset(&p, 0, sizeof p);
    strcpy(g.driver, "fake");
    strcpy(g.nvml, "fake");
    if (path == NULL || *path == '\0') {
        fprintf(stderr, "fake-nvml: GPUSLICE_FAKE_NVML_SHAPE is not set\n");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "fake-nvml: %s: %s\n", path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    p.path = path;
    while (rc == 0 && (n = getline(&line, &cap, f)) != -1) {
        p.line_no++;
        if (memchr(line, '\0', (size_t)n) != NULL)
            rc = fail(&p, "NUL byte in line");
        else
            rc = parse_line(&p, line, (size_t)n);
    }
    if (rc == 0 && ferror(f))
        rc = fail(&p, "read error");
    free(line);
    fclose(f);
    if (rc == 0) {
        p.line_no = 0;
        rc = check_machine(&p);
    }
    if (rc != 0) {
        if (p.line_no)
            fprintf(stderr, "fake-nvml: %s:%u: %s\n", path, p.line_no, p.error);
        else
            fprintf(stderr, "fake-nvml: %s: %s\n", path, p.error);
        memset(&g, 0, sizeof g);
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* ---- initialisation ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    (void)flags;
    pthread_mutex_lock(&g_lock);
    if (g_refs == 0) {
        rc = load_machine();
        if (rc == NVML_SUCCESS && g.init_error != NVML_SUCCESS)
            rc = g.init_error;
        if (rc == NVML_SUCCESS)
            memset(g_sets, 0, sizeof g_sets);
    }
    if (rc == NVML_SUCCESS)
        g_refs++;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refs == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (--g_refs == 0)
        memset(g_sets, 0, sizeof g_sets);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

const char *nvmlErrorString(nvmlReturn_t result)
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
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
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
    default: return "Unknown Error";
    }
}

/* ---- helpers: every call below takes the lock, checks init, and copies out ---- */

static nvmlReturn_t lock_initialized(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refs == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t done(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* The card behind a handle, or NULL for anything that is not one of ours. */
static struct nvmlDevice_st *card(nvmlDevice_t h)
{
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)&g.devices[0];
    if (p < base || (p - base) % sizeof g.devices[0] != 0 || (p - base) / sizeof g.devices[0] >= g.count)
        return NULL;
    return &g.devices[(p - base) / sizeof g.devices[0]];
}

static unsigned int card_index(const struct nvmlDevice_st *d) { return (unsigned int)(d - g.devices); }

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length)
{
    size_t len = strlen(text);
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < len + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, len + 1);
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, const bus_id *b)
{
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", b->domain & 0xFFFFu, b->bus & 0xFFu,
             b->device & 0x1Fu, b->function & 0x7u);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", b->domain, b->bus & 0xFFu, b->device & 0x1Fu,
             b->function & 0x7u);
    pci->domain = b->domain;
    pci->bus = b->bus;
    pci->device = b->device;
    pci->pciDeviceId = PCI_VENDOR_NVIDIA;
    pci->pciSubSystemId = 0;
}

/* An optional per-card number at `offset` in the card. */
static nvmlReturn_t card_opt(nvmlDevice_t h, unsigned int *out, size_t offset)
{
    struct nvmlDevice_st *d;
    const opt_uint *o;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(h)) == NULL || out == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    o = (const opt_uint *)(const void *)((const char *)d + offset);
    if (!o->supported)
        return done(NVML_ERROR_NOT_SUPPORTED);
    *out = o->value;
    return done(NVML_SUCCESS);
}

/* ---- system and enumeration ---- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = lock_initialized();
    return rc != NVML_SUCCESS ? rc : done(copy_text(g.driver, version, length));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = lock_initialized();
    return rc != NVML_SUCCESS ? rc : done(copy_text(g.nvml, version, length));
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *count = g.count;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if (device == NULL || index >= g.count)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g.devices[index];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL || index == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *index = card_index(d);
    return done(NVML_SUCCESS);
}

/* ---- identity ---- */

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    return done(copy_text(d->uuid, uuid, length));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    return done(copy_text(d->name, name, length));
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL || pci == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(pci, &d->bus);
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(device, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(device, pci); }

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL || memory == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    memory->total = d->total_mib << 20;
    memory->used = d->used_mib << 20;
    memory->free = memory->total - memory->used;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    unsigned int mode;
    nvmlReturn_t rc;
    if (pendingMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = card_opt(device, &mode, offsetof(struct nvmlDevice_st, mig));
    if (rc == NVML_SUCCESS) {
        if (currentMode == NULL)
            return NVML_ERROR_INVALID_ARGUMENT;
        *currentMode = mode;
        *pendingMode = mode;
    }
    return rc;
}

/* The MIG profile of a card in MIG mode, by NVML_GPU_INSTANCE_PROFILE_* index or by its id. */
static nvmlReturn_t mig_profile_of(nvmlDevice_t device, unsigned int key, int by_id, const struct mig_profile **out)
{
    const struct nvmlDevice_st *d = card(device);
    if (d == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig.supported || d->mig.value == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned int k = 0; k < d->mig_profile_count; k++) {
        const struct mig_profile *m = &d->mig_profiles[k];
        if ((by_id ? m->id : m->index) == key) {
            *out = m;
            return NVML_SUCCESS;
        }
    }
    return by_id ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info)
{
    const struct mig_profile *m;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if (info == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    rc = mig_profile_of(device, profile, 0, &m);
    if (rc != NVML_SUCCESS)
        return done(rc);
    memset(info, 0, sizeof *info);
    info->id = m->id;
    info->sliceCount = m->slices;
    info->instanceCount = m->count;
    info->multiprocessorCount = m->sms;
    info->memorySizeMB = m->memory_mib;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const struct mig_profile *m;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if (info == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    rc = mig_profile_of(device, profile, 0, &m);
    if (rc != NVML_SUCCESS)
        return done(rc);
    {
        unsigned int version = info->version;
        memset(info, 0, sizeof *info);
        info->version = version;
    }
    info->id = m->id;
    info->sliceCount = m->slices;
    info->instanceCount = m->count;
    info->multiprocessorCount = m->sms;
    info->memorySizeMB = m->memory_mib;
    memcpy(info->name, "MIG ", 4); /* the name parsed is shorter than TEXT_SIZE - 4 */
    memcpy(info->name + 4, m->name, strlen(m->name) + 1);
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                           nvmlGpuInstancePlacement_t *placements, unsigned int *count)
{
    const struct mig_profile *m;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    rc = mig_profile_of(device, profileId, 1, &m);
    if (rc != NVML_SUCCESS)
        return done(rc);
    if (placements == NULL) { /* the size query */
        *count = m->count;
        return done(NVML_SUCCESS);
    }
    if (*count < m->count) {
        *count = m->count;
        return done(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int k = 0; k < m->count; k++) {
        placements[k].start = m->starts[k];
        placements[k].size = m->size;
    }
    *count = m->count;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *v)
{
    return card_opt(device, v, offsetof(struct nvmlDevice_st, pcie[0]));
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *v)
{
    return card_opt(device, v, offsetof(struct nvmlDevice_st, pcie[1]));
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *v)
{
    return card_opt(device, v, offsetof(struct nvmlDevice_st, pcie[2]));
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *v)
{
    return card_opt(device, v, offsetof(struct nvmlDevice_st, pcie[3]));
}

nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    return card_opt(device, arch, offsetof(struct nvmlDevice_st, arch));
}

/* ---- NUMA ---- */

nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize, unsigned long *nodeSet,
                                         unsigned int scope)
{
    const size_t bits = 8 * sizeof(unsigned long);
    unsigned int node;
    nvmlReturn_t rc;
    if (nodeSet == NULL || nodeSetSize == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET)
        return NVML_ERROR_INVALID_ARGUMENT;
    rc = card_opt(device, &node, offsetof(struct nvmlDevice_st, numa));
    if (rc != NVML_SUCCESS)
        return rc;
    if (node / bits >= nodeSetSize)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memset(nodeSet, 0, nodeSetSize * sizeof nodeSet[0]);
    nodeSet[node / bits] = 1ul << (node % bits);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    return card_opt(device, node, offsetof(struct nvmlDevice_st, gpu_numa));
}

/* ---- NVLink ---- */

/* The declared link `link` of a card: NOT_SUPPORTED without NVLink, INVALID_ARGUMENT past the
 * card's links. `*active` says whether a line declared it. */
static nvmlReturn_t nvlink_of(nvmlDevice_t device, unsigned int link, struct link *out)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (d->link_count == 0)
        return done(NVML_ERROR_NOT_SUPPORTED);
    if (link >= d->link_count)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *out = d->links[link];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *isActive)
{
    struct link l;
    nvmlReturn_t rc;
    if (isActive == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = nvlink_of(device, link, &l)) == NVML_SUCCESS)
        *isActive = l.declared ? 1u : 0u; /* NVML_FEATURE_ENABLED / DISABLED */
    return rc;
}

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    struct link l;
    nvmlReturn_t rc;
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = nvlink_of(device, link, &l)) != NVML_SUCCESS)
        return rc;
    if (!l.declared || !l.version.supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *version = l.version.value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    struct link l;
    nvmlReturn_t rc;
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = nvlink_of(device, link, &l)) != NVML_SUCCESS)
        return rc;
    if (!l.declared)
        return NVML_ERROR_NOT_SUPPORTED;
    fill_pci(pci, &l.remote);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, unsigned int *type)
{
    struct link l;
    nvmlReturn_t rc;
    if (type == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = nvlink_of(device, link, &l)) != NVML_SUCCESS)
        return rc;
    if (!l.declared || !l.type.supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *type = l.type.value;
    return NVML_SUCCESS;
}

/* ---- pairs ---- */

static nvmlReturn_t pair_of(nvmlDevice_t a, nvmlDevice_t b, struct pair *out, int *same)
{
    struct nvmlDevice_st *da, *db;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((da = card(a)) == NULL || (db = card(b)) == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    *same = da == db;
    *out = g.pairs[card_index(da)][card_index(db)];
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2, unsigned int *pathInfo)
{
    struct pair pr;
    int same;
    nvmlReturn_t rc;
    if (pathInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = pair_of(device1, device2, &pr, &same)) != NVML_SUCCESS)
        return rc;
    if (same) {
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
        return NVML_SUCCESS;
    }
    if (!pr.level.supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *pathInfo = pr.level.value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, unsigned int p2pIndex,
                                    unsigned int *p2pStatus)
{
    struct pair pr;
    const opt_uint *o;
    int same;
    nvmlReturn_t rc;
    if (p2pStatus == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = pair_of(device1, device2, &pr, &same)) != NVML_SUCCESS)
        return rc;
    if (same)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (p2pIndex == NVML_P2P_CAPS_INDEX_READ)
        o = &pr.read;
    else if (p2pIndex == NVML_P2P_CAPS_INDEX_WRITE)
        o = &pr.write;
    else
        return NVML_ERROR_NOT_SUPPORTED;
    if (!o->supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *p2pStatus = o->value;
    return NVML_SUCCESS;
}

/* ---- telemetry ---- */

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return card_opt(device, temp, offsetof(struct nvmlDevice_st, temperature));
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return card_opt(device, power, offsetof(struct nvmlDevice_st, power_mw));
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return card_opt(device, limit, offsetof(struct nvmlDevice_st, power_limit_mw));
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL || utilization == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->util_supported)
        return done(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = d->util_gpu;
    utilization->memory = d->util_memory;
    return done(NVML_SUCCESS);
}

/* ---- events ---- */

static struct nvmlEventSet_st *event_set(nvmlEventSet_t set)
{
    uintptr_t p = (uintptr_t)set, base = (uintptr_t)&g_sets[0];
    if (p < base || (p - base) % sizeof g_sets[0] != 0 || (p - base) / sizeof g_sets[0] >= MAX_SETS)
        return NULL;
    return g_sets[(p - base) / sizeof g_sets[0]].in_use ? &g_sets[(p - base) / sizeof g_sets[0]] : NULL;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if (set == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    for (size_t i = 0; i < MAX_SETS; i++) {
        if (!g_sets[i].in_use) {
            memset(&g_sets[i], 0, sizeof g_sets[i]);
            g_sets[i].in_use = 1;
            g_sets[i].created_ms = now_ms();
            *set = &g_sets[i];
            return done(NVML_SUCCESS);
        }
    }
    return done(NVML_ERROR_MEMORY);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    struct nvmlEventSet_st *s;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((s = event_set(set)) == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    s->in_use = 0;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL || eventTypes == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->events_supported)
        return done(NVML_ERROR_NOT_SUPPORTED);
    *eventTypes = d->event_types;
    return done(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    struct nvmlDevice_st *d;
    struct nvmlEventSet_st *s;
    nvmlReturn_t rc = lock_initialized();
    if (rc != NVML_SUCCESS)
        return rc;
    if ((d = card(device)) == NULL || (s = event_set(set)) == NULL)
        return done(NVML_ERROR_INVALID_ARGUMENT);
    if (!d->events_supported || (eventTypes & ~d->event_types) != 0)
        return done(NVML_ERROR_NOT_SUPPORTED);
    s->registered[card_index(d)] |= eventTypes;
    return done(NVML_SUCCESS);
}

static int registered_for(const struct nvmlEventSet_st *s, const struct event *e)
{
    if (e->device >= 0)
        return (s->registered[e->device] & e->type) != 0;
    for (unsigned int i = 0; i < g.count; i++)
        if (s->registered[i] & e->type)
            return 1;
    return 0;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    const unsigned long long deadline = now_ms() + timeoutms;
    if (data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (;;) {
        struct nvmlEventSet_st *s;
        unsigned long long now, next = deadline;
        struct timespec nap;
        nvmlReturn_t rc = lock_initialized();
        if (rc != NVML_SUCCESS)
            return rc;
        if ((s = event_set(set)) == NULL)
            return done(NVML_ERROR_INVALID_ARGUMENT);
        now = now_ms();
        for (unsigned int i = 0; i < g.event_count; i++) {
            struct event *e = &g.events[i];
            unsigned long long due = s->created_ms + e->after_ms;
            if (e->delivered || !registered_for(s, e))
                continue;
            if (due <= now) {
                e->delivered = 1;
                memset(data, 0, sizeof *data);
                data->device = e->device >= 0 ? &g.devices[e->device] : NULL;
                data->eventType = e->type;
                data->eventData = e->data;
                data->gpuInstanceId = 0xFFFFFFFFu;
                data->computeInstanceId = 0xFFFFFFFFu;
                return done(NVML_SUCCESS);
            }
            if (due < next)
                next = due;
        }
        pthread_mutex_unlock(&g_lock);
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        if (next > now + WAIT_STEP_MS) /* wake now and then: a shutdown or a free ends the wait */
            next = now + WAIT_STEP_MS;
        nap.tv_sec = (time_t)((next - now) / 1000);
        nap.tv_nsec = (long)((next - now) % 1000) * 1000000L;
        nanosleep(&nap, NULL);
    }
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
