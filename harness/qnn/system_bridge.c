/*
 * A stand-in libQnnSystem.so that sits between ExecuTorch's QNN backend and the real QNN system library.
 *
 * Why it exists (docs/FINDINGS.md#F19): systemDlcComposeGraphs, which composes an online-prepared program's
 * graphs when it loads, takes the backend's QnnInterface_t BY VALUE. Its size is fixed by the headers the
 * caller was built with: the executorch 1.5.1 wheel's (QNN 2.37: 69 functions, 592 bytes) against the
 * library's (QNN API 2.40: 75 functions, 640 bytes). On x86_64 a struct that large is copied onto the stack,
 * so the library reads every later argument 48 bytes too high, writes the composed graphs over the caller's
 * frame and the caller then jumps to address 0 (SIGSEGV at load). With QNNSUITE_BRIDGE_COMPOSE_GRAPHS=1 this
 * library hands out the real system interface with one entry replaced: a composeGraphs that takes the
 * caller's 592 bytes, completes them to the library's 640 with the newer entries of the backend's own
 * provider table, and calls the real one. Unset: the real interface, unchanged (the bridge does nothing).
 * harness/qnn/toolchain.py turns it on only after an online-prepared probe program crashes without it and
 * loads and runs correctly with it.
 *
 * Nothing in the real library is patched: its interface table is copied and one entry replaced, as the
 * interposer (interposer.c) does for libQnnHtp.so.
 *
 * Environment:
 *   QNNSUITE_REAL_QNNSYSTEM        path of the real library (default: libQnnSystem.real.so beside this one)
 *   QNNSUITE_BRIDGE_COMPOSE_GRAPHS 1 to re-lay composeGraphs' by-value interface argument
 * Built with -DENV_PREFIX='"OTHER_"' it reads OTHER_REAL_QNNSYSTEM etc. instead (the emulated phone's own).
 */
#define _GNU_SOURCE
#ifndef ENV_PREFIX
#define ENV_PREFIX "QNNSUITE_"
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qnn_status;
enum { QNN_COMMON_ERROR_GENERAL = 1000 };

/* QnnInterface_t as each side lays it out: 40 bytes of header (backend id, provider name, API versions), then
 * the functions. Pointer words, so the by-value copy is laid out (and aligned) as the real struct's. */
enum { INTERFACE_HEADER_BYTES = 40, CALLER_FUNCTIONS = 69, LIBRARY_FUNCTIONS = 75 };
typedef struct { uint64_t words[(INTERFACE_HEADER_BYTES + 8 * CALLER_FUNCTIONS) / 8]; } caller_interface;
typedef struct { uint64_t words[(INTERFACE_HEADER_BYTES + 8 * LIBRARY_FUNCTIONS) / 8]; } library_interface;
_Static_assert(sizeof(caller_interface) == 592, "the executorch 1.5.1 wheel's QnnInterface_t");
_Static_assert(sizeof(library_interface) == 640, "QNN API 2.40's QnnInterface_t");

/* QnnSystemInterface_t: its functions start at byte 32 (backend id, provider name, a 12-byte version);
 * systemDlcComposeGraphs is at byte 0x70, where executorch's QnnDlcManager calls it (measured). */
enum { SYSTEM_TABLE_BYTES = 512, COMPOSE_GRAPHS_OFFSET = 0x70 };

typedef qnn_status (*compose_fn)(void *, const void **, uint32_t, void *, void *, library_interface, uint32_t,
                                 void **, uint32_t *);
typedef qnn_status (*system_get_providers_fn)(const void ***, uint32_t *);
typedef qnn_status (*backend_get_providers_fn)(const void ***, uint32_t *);

enum { MAX_PROVIDERS = 8 };
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[512];
static const void **our_providers;
static uint32_t provider_count;
static compose_fn real_compose;
static system_get_providers_fn real_internal_get; /* the library's other export, forwarded as it is */

/* The backend's own provider table with this backend id: where the functions the caller's headers lack are. */
static const unsigned char *backend_table(uint32_t backend_id) {
    void *backend = dlopen("libQnnHtp.so", RTLD_NOW | RTLD_NOLOAD);
    backend_get_providers_fn get = backend ? (backend_get_providers_fn)dlsym(backend, "QnnInterface_getProviders") : 0;
    const void **list = NULL;
    uint32_t count = 0;
    if (!get || get(&list, &count) != 0) return NULL;
    for (uint32_t i = 0; i < count; i++)
        if (memcmp(list[i], &backend_id, sizeof backend_id) == 0) return list[i];
    return NULL;
}

static qnn_status bridged_compose(void *dlc, const void **configs, uint32_t config_count, void *backend,
                                  void *context, caller_interface given, uint32_t graph_version, void **graphs,
                                  uint32_t *graph_count) {
    uint32_t backend_id;
    memcpy(&backend_id, &given, sizeof backend_id);
    const unsigned char *full = backend_table(backend_id);
    if (!full) {
        fprintf(stderr, "[qnnsuite system bridge] no loaded backend provider matches the composeGraphs interface\n");
        return QNN_COMMON_ERROR_GENERAL;
    }
    library_interface laid;
    memcpy(&laid, &given, sizeof given);
    memcpy((unsigned char *)&laid + sizeof given, full + sizeof given, sizeof laid - sizeof given);
    return real_compose(dlc, configs, config_count, backend, context, laid, graph_version, graphs, graph_count);
}

static void load_real_library(void) {
    const char *path = getenv(ENV_PREFIX "REAL_QNNSYSTEM");
    char sibling[4096];
    if (!path || !*path) {
        Dl_info self;
        if (!dladdr((void *)&load_real_library, &self) || !self.dli_fname) {
            snprintf(load_error, sizeof load_error, "cannot locate the system bridge itself");
            return;
        }
        snprintf(sibling, sizeof sibling, "%s", self.dli_fname);
        char *slash = strrchr(sibling, '/');
        snprintf(slash ? slash + 1 : sibling, sizeof sibling - (slash ? (size_t)(slash + 1 - sibling) : 0),
                 "libQnnSystem.real.so");
        path = sibling;
    }
    void *real = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!real) {
        snprintf(load_error, sizeof load_error, "%s", dlerror());
        return;
    }
    system_get_providers_fn get = (system_get_providers_fn)dlsym(real, "QnnSystemInterface_getProviders");
    const void **list = NULL;
    uint32_t count = 0;
    if (!get || get(&list, &count) != 0 || count == 0) {
        snprintf(load_error, sizeof load_error, "%.400s has no usable QnnSystemInterface_getProviders", path);
        return;
    }
    real_internal_get = (system_get_providers_fn)dlsym(real, "QnnSystemInterfaceInternal_getProviders");
    const char *bridge = getenv(ENV_PREFIX "BRIDGE_COMPOSE_GRAPHS");
    if (!bridge || strcmp(bridge, "1") != 0) {  /* off: the real providers themselves */
        our_providers = list;
        provider_count = count;
        return;
    }
    if (count > MAX_PROVIDERS) count = MAX_PROVIDERS;
    our_providers = calloc(count, sizeof *our_providers);
    for (uint32_t i = 0; our_providers && i < count; i++) {
        unsigned char *copy = malloc(SYSTEM_TABLE_BYTES);
        if (!copy) return;
        memcpy(copy, list[i], SYSTEM_TABLE_BYTES);
        real_compose = *(compose_fn *)(copy + COMPOSE_GRAPHS_OFFSET);
        *(void **)(copy + COMPOSE_GRAPHS_OFFSET) = (void *)bridged_compose;
        our_providers[i] = copy;
    }
    provider_count = count;
}

__attribute__((visibility("default")))
qnn_status QnnSystemInterface_getProviders(const void ***providers, uint32_t *count) {
    pthread_once(&load_once, load_real_library);
    if (!our_providers) {
        fprintf(stderr, "[qnnsuite system bridge] cannot load the real libQnnSystem.so: %s\n", load_error);
        return QNN_COMMON_ERROR_GENERAL;
    }
    *providers = our_providers;
    *count = provider_count;
    return 0;
}

__attribute__((visibility("default")))
qnn_status QnnSystemInterfaceInternal_getProviders(const void ***providers, uint32_t *count) {
    pthread_once(&load_once, load_real_library);
    if (!real_internal_get) {
        fprintf(stderr, "[qnnsuite system bridge] the real libQnnSystem.so has no internal providers: %s\n", load_error);
        return QNN_COMMON_ERROR_GENERAL;
    }
    return real_internal_get(providers, count);
}
