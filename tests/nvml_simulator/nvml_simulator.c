/*
 * A stand-in libnvidia-ml.so.1 for tests and the demo.
 *
 * Built against NVIDIA's real nvml.h (PyPI package nvidia-nvml-dev) so that every
 * signature and struct layout is the one the real pynvml expects. The GPUs it
 * reports come from a JSON scenario file named by $NVMLSIM_CONFIG; see
 * README.md beside this file for the format. The file is read again whenever it
 * changes, so a test can change a GPU's state under a running process.
 *
 * Conventions, chosen to mirror a real driver:
 *   - a key missing from a device answers NVML_ERROR_NOT_SUPPORTED;
 *   - "errors": {"<nvml function>": "<NVML error name>"} injects a failure into
 *     one call of one device, "*" into every call of that device;
 *   - top-level "initError" makes nvmlInit fail (e.g. "DRIVER_NOT_LOADED").
 *
 * nvmlsimCallCount()/nvmlsimResetCallCount() are not NVML: benchmarks use them
 * to count the NVML calls a collector makes.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIM_EXPORT __attribute__((visibility("default")))
#define SIM_MAX_GPUS 256
#define SIM_MAX_MIG 16     /* entries of "migDevices": GPU instances and their compute instances */
#define SIM_MAX_GI_ID 16
#define SIM_MAX_CI_ID 8
#define SIM_MAX_PROCESS_SAMPLES 1024   /* utilization samples one query answers */

/* ------------------------------------------------------------------ JSON */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype type;
    long long num;        /* J_NUM (integral part), J_BOOL */
    char *str;            /* J_STR; key for members of an object */
    char *key;
    struct jval *child;   /* first element / member */
    struct jval *next;
} jval;

typedef struct {
    const char *text;
    const char *pos;
    const char *error;
} jparser;

static jval *j_new(jtype type)
{
    jval *v = calloc(1, sizeof(*v));
    if (v)
        v->type = type;
    return v;
}

static void j_free(jval *v)
{
    while (v) {
        jval *next = v->next;
        j_free(v->child);
        free(v->str);
        free(v->key);
        free(v);
        v = next;
    }
}

static void j_skip_ws(jparser *p)
{
    while (*p->pos && isspace((unsigned char)*p->pos))
        p->pos++;
}

static jval *j_parse_value(jparser *p, int depth);

static char *j_parse_string(jparser *p)
{
    size_t cap = 32, len = 0;
    char *out;

    if (*p->pos != '"') {
        p->error = "expected a string";
        return NULL;
    }
    p->pos++;
    out = malloc(cap);
    if (!out) {
        p->error = "out of memory";
        return NULL;
    }
    while (*p->pos && *p->pos != '"') {
        char c = *p->pos++;
        if (c == '\\') {
            char esc = *p->pos++;
            switch (esc) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case '"': case '\\': case '/': c = esc; break;
            default:
                /* \uXXXX and the rarer escapes are not needed by scenarios */
                free(out);
                p->error = "unsupported escape in string";
                return NULL;
            }
        }
        if (len + 2 > cap) {
            char *grown = realloc(out, cap *= 2);
            if (!grown) {
                free(out);
                p->error = "out of memory";
                return NULL;
            }
            out = grown;
        }
        out[len++] = c;
    }
    if (*p->pos != '"') {
        free(out);
        p->error = "unterminated string";
        return NULL;
    }
    p->pos++;
    out[len] = '\0';
    return out;
}

static jval *j_parse_container(jparser *p, int depth, int is_object)
{
    char close = is_object ? '}' : ']';
    jval *container = j_new(is_object ? J_OBJ : J_ARR);
    jval **tail;

    if (!container) {
        p->error = "out of memory";
        return NULL;
    }
    tail = &container->child;
    p->pos++;
    j_skip_ws(p);
    if (*p->pos == close) {
        p->pos++;
        return container;
    }
    for (;;) {
        char *key = NULL;
        jval *item;

        j_skip_ws(p);
        if (is_object) {
            key = j_parse_string(p);
            if (!key)
                goto fail;
            j_skip_ws(p);
            if (*p->pos != ':') {
                free(key);
                p->error = "expected ':' after an object key";
                goto fail;
            }
            p->pos++;
        }
        item = j_parse_value(p, depth + 1);
        if (!item) {
            free(key);
            goto fail;
        }
        item->key = key;
        *tail = item;
        tail = &item->next;
        j_skip_ws(p);
        if (*p->pos == ',') {
            p->pos++;
            continue;
        }
        if (*p->pos == close) {
            p->pos++;
            return container;
        }
        p->error = is_object ? "expected ',' or '}'" : "expected ',' or ']'";
        goto fail;
    }
fail:
    j_free(container);
    return NULL;
}

static jval *j_parse_value(jparser *p, int depth)
{
    jval *v;

    if (depth > 64) {
        p->error = "nesting too deep";
        return NULL;
    }
    j_skip_ws(p);
    switch (*p->pos) {
    case '{':
        return j_parse_container(p, depth, 1);
    case '[':
        return j_parse_container(p, depth, 0);
    case '"':
        v = j_new(J_STR);
        if (v && !(v->str = j_parse_string(p))) {
            free(v);
            return NULL;
        }
        return v;
    case 't':
    case 'f':
    case 'n': {
        static const struct { const char *word; jtype type; long long num; } words[] = {
            {"true", J_BOOL, 1}, {"false", J_BOOL, 0}, {"null", J_NULL, 0},
        };
        for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
            size_t n = strlen(words[i].word);
            if (strncmp(p->pos, words[i].word, n) == 0) {
                p->pos += n;
                v = j_new(words[i].type);
                if (v)
                    v->num = words[i].num;
                return v;
            }
        }
        p->error = "unexpected word";
        return NULL;
    }
    default: {
        char *end;
        long long num;

        errno = 0;
        num = strtoll(p->pos, &end, 0);
        if (end == p->pos || errno == ERANGE) {
            p->error = "expected a value";
            return NULL;
        }
        if (*end == '.' || *end == 'e' || *end == 'E') {
            p->error = "only integers are supported";
            return NULL;
        }
        p->pos = end;
        v = j_new(J_NUM);
        if (v)
            v->num = num;
        return v;
    }
    }
}

static const jval *j_get(const jval *obj, const char *key)
{
    if (!obj || obj->type != J_OBJ)
        return NULL;
    for (const jval *m = obj->child; m; m = m->next)
        if (strcmp(m->key, key) == 0)
            return m;
    return NULL;
}

static const jval *j_at(const jval *arr, unsigned int index)
{
    if (!arr || arr->type != J_ARR)
        return NULL;
    for (const jval *e = arr->child; e; e = e->next, index--)
        if (index == 0)
            return e;
    return NULL;
}

static unsigned int j_len(const jval *arr)
{
    unsigned int n = 0;
    if (arr && arr->type == J_ARR)
        for (const jval *e = arr->child; e; e = e->next)
            n++;
    return n;
}

/* ------------------------------------------------------------ the state */

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static jval *sim_root;
static const jval *sim_devices[SIM_MAX_GPUS];
static unsigned int sim_device_count;
static int sim_init_refcount;
static struct timespec sim_loaded_mtime;
static off_t sim_loaded_size;
static ino_t sim_loaded_ino;
static unsigned long long sim_calls;
static unsigned long long sim_generation;      /* counts scenario loads */
static struct timespec sim_loaded_at;          /* when the scenario was last loaded */

/* Stable addresses that serve as handles: they never dangle across reloads. */
static char sim_gpu_handles[SIM_MAX_GPUS];
static char sim_mig_handles[SIM_MAX_GPUS][SIM_MAX_MIG];
static struct nvmlGpuInstance_st { char unused; } sim_gi_handles[SIM_MAX_GPUS][SIM_MAX_GI_ID];
static struct nvmlComputeInstance_st { char unused; } sim_ci_handles[SIM_MAX_GPUS][SIM_MAX_GI_ID][SIM_MAX_CI_ID];

static const struct { const char *name; nvmlReturn_t code; const char *text; } sim_errors[] = {
    {"SUCCESS", NVML_SUCCESS, "Success"},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {"ALREADY_INITIALIZED", NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND, "Not Found"},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {"INSUFFICIENT_POWER", NVML_ERROR_INSUFFICIENT_POWER, "Insufficient External Power"},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {"TIMEOUT", NVML_ERROR_TIMEOUT, "Timeout"},
    {"IRQ_ISSUE", NVML_ERROR_IRQ_ISSUE, "Interrupt Request Issue"},
    {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"},
    {"CORRUPTED_INFOROM", NVML_ERROR_CORRUPTED_INFOROM, "Corrupted infoROM"},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED, "GPU requires restart"},
    {"OPERATING_SYSTEM", NVML_ERROR_OPERATING_SYSTEM, "The operating system has blocked the request."},
    {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH, "RM has detected an NVML/RM version mismatch."},
    {"MEMORY", NVML_ERROR_MEMORY, "Insufficient Memory"},
    {"NO_DATA", NVML_ERROR_NO_DATA, "No data"},
    {"IN_USE", NVML_ERROR_IN_USE, "In use by another client"},
    {"INSUFFICIENT_RESOURCES", NVML_ERROR_INSUFFICIENT_RESOURCES, "Insufficient resources"},
    {"UNKNOWN", NVML_ERROR_UNKNOWN, "Unknown Error"},
};

static const char *sim_config_path(void);

static nvmlReturn_t sim_error_code(const char *name)
{
    for (size_t i = 0; i < sizeof(sim_errors) / sizeof(sim_errors[0]); i++)
        if (strcmp(sim_errors[i].name, name) == 0)
            return sim_errors[i].code;
    fprintf(stderr, "nvml-simulator: unknown NVML error name \"%s\" in %s; using UNKNOWN\n",
            name, sim_config_path());
    return NVML_ERROR_UNKNOWN;
}

static void sim_unload(void)
{
    j_free(sim_root);
    sim_root = NULL;
    sim_device_count = 0;
}

static void sim_report_parse_error(const char *path, const char *text, const jparser *p)
{
    unsigned int line = 1, column = 1;
    for (const char *c = text; c < p->pos; c++) {
        if (*c == '\n') {
            line++;
            column = 1;
        } else {
            column++;
        }
    }
    fprintf(stderr, "nvml-simulator: %s:%u:%u: %s\n", path, line, column, p->error);
}

/* The line after which a library carries its own scenario (see sim_config_path). */
#define SIM_EMBEDDED_MARKER "\n#nvml-simulator-scenario\n"
static int sim_embedded;

/* $NVMLSIM_CONFIG, or the path built in with -DNVMLSIM_DEFAULT_CONFIG (the stand-in driver
 * packages of the molecule tests ship the library with a scenario beside it), or else this
 * library's own file, which then carries its scenario after SIM_EMBEDDED_MARKER: a driver root's
 * copy answers for its GPUs inside a container, where only the library is mounted. */
static const char *sim_config_path(void)
{
    const char *path = getenv("NVMLSIM_CONFIG");
    Dl_info self;
#ifdef NVMLSIM_DEFAULT_CONFIG
    if (!path || !*path)
        path = NVMLSIM_DEFAULT_CONFIG;
#endif
    sim_embedded = 0;
    if ((!path || !*path) && dladdr((void *)sim_config_path, &self) && self.dli_fname && *self.dli_fname) {
        sim_embedded = 1;
        path = self.dli_fname;
    }
    return path;
}

/* Where the scenario starts in `text` (`size` bytes): after the last marker of an embedded one,
 * which a JSON object follows (the library's own copy of the marker, among its constants, is
 * followed by a NUL). */
static char *sim_scenario_start(char *text, size_t size)
{
    const size_t marker = sizeof SIM_EMBEDDED_MARKER - 1;
    char *found = NULL;

    if (!sim_embedded)
        return text;
    for (char *at = text; (at = memmem(at, size - (size_t)(at - text), SIM_EMBEDDED_MARKER, marker)); at++)
        found = at;
    return found && found[marker] == '{' ? found + marker : NULL;
}

static int sim_entry_number(const jval *entry, const char *key, long long fallback);
static unsigned int sim_device_minor[SIM_MAX_GPUS];

/* Whether <root>/dev/<name> is a character device. */
static int sim_char_device(const char *root, const char *name)
{
    char path[PATH_MAX];
    struct stat st;

    if ((size_t)snprintf(path, sizeof path, "%s/dev/%s", root, name) >= sizeof path)
        return 0;
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

/* The folder whose dev/ says what the process may reach ($NVMLSIM_DEV_ROOT, or / for a library that
 * carries its scenario), or NULL when every GPU is reachable. */
static const char *sim_dev_root;

/* Whether a MIG device (a migDevices entry of the GPU with minor `gpu_minor`) is reachable: with a dev
 * root, the driver lets a process use a MIG device only through the capability nodes of its GPU instance
 * and compute instance, /dev/nvidia-caps/nvidia-cap<minor>, numbered as the driver's
 * /proc/driver/nvidia-caps/mig-minors lists them: config 1, monitor 2, then for each GPU its 15 GPU
 * instances, each one's access node followed by those of its 8 compute instances. */
static int sim_mig_reachable(unsigned int gpu_minor, const jval *entry)
{
    char name[48];
    long long gi = sim_entry_number(entry, "gpuInstanceId", -1), ci = sim_entry_number(entry, "computeInstanceId", -1);
    long long gi_minor = 3 + (long long)gpu_minor * 15 * 9 + gi * 9;

    if (!sim_dev_root)
        return 1;
    if (gi < 0 || ci < 0)
        return 0;
    snprintf(name, sizeof name, "nvidia-caps/nvidia-cap%lld", gi_minor);
    if (!sim_char_device(sim_dev_root, name))
        return 0;
    snprintf(name, sizeof name, "nvidia-caps/nvidia-cap%lld", gi_minor + 1 + ci);
    return sim_char_device(sim_dev_root, name);
}

/* Reads the scenario file; returns NVML_SUCCESS or the error nvmlInit should give.
 * With $NVMLSIM_DEV_ROOT set (/ inside a container), NVML sees what the driver lets a process
 * there see: no driver without <root>/dev/nvidiactl, only the GPUs whose <root>/dev/nvidia<minor>
 * exists, in scenario order, and only the MIG devices whose capability nodes exist (sim_mig_reachable). */
static nvmlReturn_t sim_load(void)
{
    const char *path = sim_config_path();
    struct stat st;
    FILE *f;
    char *text;
    jparser parser;
    jval *root;
    const jval *devices;

    if (!path || !*path) {
        fprintf(stderr, "nvml-simulator: NVMLSIM_CONFIG is not set; "
                        "set it to a scenario file (see tests/nvml_simulator/README.md)\n");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (stat(path, &st) != 0 || !(f = fopen(path, "rb"))) {
        fprintf(stderr, "nvml-simulator: cannot read NVMLSIM_CONFIG=%s: %s\n", path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    text = malloc((size_t)st.st_size + 1);
    if (!text) {
        fclose(f);
        return NVML_ERROR_MEMORY;
    }
    size_t size = fread(text, 1, (size_t)st.st_size, f);
    text[size] = '\0';
    fclose(f);

    char *scenario = sim_scenario_start(text, size);
    if (!scenario) {
        fprintf(stderr, "nvml-simulator: NVMLSIM_CONFIG is not set and %s carries no scenario\n", path);
        free(text);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    parser.text = parser.pos = scenario;
    parser.error = NULL;
    root = j_parse_value(&parser, 0);
    if (root) {
        j_skip_ws(&parser);
        if (*parser.pos) {
            parser.error = "unexpected text after the document";
            j_free(root);
            root = NULL;
        } else if (root->type != J_OBJ) {
            parser.error = "the document must be a JSON object";
            j_free(root);
            root = NULL;
        }
    }
    if (!root) {
        sim_report_parse_error(path, scenario, &parser);
        free(text);
        return NVML_ERROR_UNKNOWN;
    }
    free(text);

    devices = j_get(root, "devices");
    if (j_len(devices) > SIM_MAX_GPUS) {
        fprintf(stderr, "nvml-simulator: %s: at most %d devices are supported\n", path, SIM_MAX_GPUS);
        j_free(root);
        return NVML_ERROR_UNKNOWN;
    }
    const char *dev_root = getenv("NVMLSIM_DEV_ROOT");
    if (!dev_root && sim_embedded)
        dev_root = "/";     /* a library that carries its scenario runs in a container */
    int filtered = dev_root && *dev_root;
    if (filtered && !sim_char_device(dev_root, "nvidiactl")) {
        fprintf(stderr, "nvml-simulator: no %s/dev/nvidiactl: the driver is out of reach\n", dev_root);
        j_free(root);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    sim_unload();
    sim_root = root;
    sim_dev_root = filtered ? dev_root : NULL;
    sim_device_count = 0;
    unsigned int position = 0;
    for (const jval *d = devices ? devices->child : NULL; d; d = d->next, position++) {
        unsigned int minor = (unsigned int)sim_entry_number(d, "minorNumber", position);
        char name[32];
        snprintf(name, sizeof name, "nvidia%u", minor);
        if (filtered && !sim_char_device(dev_root, name))
            continue;
        sim_device_minor[sim_device_count] = minor;
        sim_devices[sim_device_count++] = d;
    }
    sim_loaded_mtime = st.st_mtim;
    sim_loaded_size = st.st_size;
    sim_loaded_ino = st.st_ino;
    sim_generation++;
    clock_gettime(CLOCK_MONOTONIC, &sim_loaded_at);
    return NVML_SUCCESS;
}

/* Whether `st` is not the scenario file loaded (replaced or rewritten), or none is loaded. */
static int sim_differs(const struct stat *st)
{
    return !sim_root || st->st_mtim.tv_sec != sim_loaded_mtime.tv_sec ||
           st->st_mtim.tv_nsec != sim_loaded_mtime.tv_nsec || st->st_size != sim_loaded_size ||
           st->st_ino != sim_loaded_ino;
}

/* Whether the scenario file is not the one loaded (replaced, rewritten, gone, or none loaded). */
static int sim_changed(void)
{
    const char *path = sim_config_path();
    struct stat st;

    return !path || stat(path, &st) != 0 || sim_differs(&st);
}

/* Reloads the scenario when its file was replaced or rewritten (a bad new file keeps the old); one stat. */
static void sim_refresh(void)
{
    const char *path = sim_config_path();
    struct stat st;

    if (path && stat(path, &st) == 0 && sim_differs(&st))
        sim_load();
}

static int sim_mig_enabled(const jval *gpu);

typedef struct {
    const jval *gpu;      /* the physical GPU's description */
    const jval *mig;      /* the MIG device's description, or NULL */
    unsigned int index;
} sim_device;

static int sim_resolve(nvmlDevice_t handle, sim_device *out)
{
    uintptr_t h = (uintptr_t)handle;
    uintptr_t gpus = (uintptr_t)sim_gpu_handles, migs = (uintptr_t)sim_mig_handles;

    if (h >= gpus && h < gpus + SIM_MAX_GPUS) {
        out->index = (unsigned int)(h - gpus);
        out->mig = NULL;
    } else if (h >= migs && h < migs + sizeof(sim_mig_handles)) {
        unsigned int offset = (unsigned int)(h - migs);
        const jval *list;
        out->index = offset / SIM_MAX_MIG;
        if (out->index >= sim_device_count)
            return 0;
        list = j_get(sim_devices[out->index], "migDevices");
        out->mig = j_at(list, offset % SIM_MAX_MIG);
        /* an entry without a compute instance is a bare GPU instance, not a MIG device */
        if (!out->mig || !j_get(out->mig, "computeInstanceId"))
            return 0;
    } else {
        return 0;
    }
    if (out->index >= sim_device_count)
        return 0;
    out->gpu = sim_devices[out->index];
    return 1;
}

/* An error injected into `function` for this device, or NVML_SUCCESS. */
static nvmlReturn_t sim_injected(const jval *scope, const char *function)
{
    const jval *errors = j_get(scope, "errors");
    const jval *e;

    if (!errors)
        return NVML_SUCCESS;
    e = j_get(errors, function);
    if (!e)
        e = j_get(errors, "*");
    if (e && e->type == J_STR)
        return sim_error_code(e->str);
    if (e && e->type == J_OBJ) {
        /* {"error": "UNINITIALIZED", "times": 1}: the next `times` calls fail, then the call works
         * again (until the file changes). The count lives in the loaded document. */
        const jval *name = j_get(e, "error");
        jval *times = (jval *)j_get(e, "times");
        if (!name || name->type != J_STR)
            return NVML_SUCCESS;
        if (times && times->type == J_NUM) {
            if (times->num <= 0)
                return NVML_SUCCESS;
            times->num--;
        }
        return sim_error_code(name->str);
    }
    return NVML_SUCCESS;
}

static int sim_number(const jval *obj, const char *key, long long *out)
{
    const jval *v = j_get(obj, key);
    if (!v || (v->type != J_NUM && v->type != J_BOOL))
        return 0;
    *out = v->num;
    return 1;
}

static nvmlReturn_t sim_copy_string(const jval *obj, const char *key, char *buf, unsigned int length)
{
    const jval *v = j_get(obj, key);
    size_t n;

    if (!v || v->type != J_STR)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    n = strlen(v->str);
    if (n + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, v->str, n + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------- the cost model */

/*
 * What each call costs, in nanoseconds, on an NVIDIA H100 80GB HBM3 (driver 580.159.04, NVML kept
 * initialised, mean of 20 collections through pynvml). A simulated call spends its cost busy, as
 * a real call spends it in the driver's ioctl, so it shows as the caller's CPU time. nvmlInit and
 * nvmlShutdown together took 10.93 ms (the readings do not split them; half each here). A fresh
 * session's first nvmlDeviceGetHandleByIndex of a device costs SIM_REAL_ATTACH_NS more: NVML
 * attaches the GPU then (one collection with init and shutdown took 26.87 ms, 10.72 ms more than
 * init, shutdown and the queries). Calls not listed cost SIM_REAL_OTHER_NS.
 */
static const struct { const char *name; long long ns; } sim_real_costs[] = {
    /* measured inside the agent's tick on the H100 (agent-tick-call-costs), and for the counters
     * of dcgm-exporter one call at a time (dcgm-counter-calls) */
    {"nvmlGpmSampleGet", 177200},
    /* not measured (no MIG layout may be made on the cards lent): charged as a whole GPU's sample */
    {"nvmlGpmMigSampleGet", 177200},
    {"nvmlDeviceGetTotalEnergyConsumption", 4322300},
    {"nvmlDeviceGetPcieReplayCounter", 182200},
    {"nvmlGpmSampleAlloc", 11000},
    {"nvmlGpmMetricsGet", 6100},
    {"nvmlGpmSampleFree", 3500},
    {"nvmlDeviceGetEncoderUtilization", 2800},
    {"nvmlDeviceGetDecoderUtilization", 2400},
    {"nvmlDeviceGetVirtualizationMode", 1700},
    {"nvmlDeviceGetGridLicensableFeatures_v4", 194700},
    {"nvmlInitWithFlags", 5465000},
    {"nvmlShutdown", 5465000},
    {"nvmlDeviceGetMaxClockInfo", 1853500},
    {"nvmlDeviceGetEccMode", 441000},
    {"nvmlDeviceGetRetiredPagesPendingStatus", 402000},
    {"nvmlDeviceGetMigMode", 374000},
    {"nvmlDeviceGetPowerManagementLimit", 250000},
    {"nvmlDeviceGetFieldValues", 39300},
    {"nvmlDeviceGetComputeRunningProcesses_v3", 29300},
    /* Per-process utilization, from the H200 readings in real-h200/processes.json (driver 580.159.04,
     * median of 200 pynvml reads): a read that found samples (two calls, size then samples) took
     * 1.68 to 1.77 ms, so each call is charged half; one that found none (one call answering
     * NOT_FOUND) took 2.3 to 2.5 ms, so that answer costs SIM_REAL_NO_SAMPLES_NS more. These replace a
     * provisional 0.05 ms guess; they were not taken on the H100 the rest of this table comes from. */
    {"nvmlDeviceGetProcessUtilization", 860000},
    {"nvmlDeviceGetProcessesUtilizationInfo", 880000},
    {"nvmlDeviceGetMemoryInfo", 74900},
    {"nvmlDeviceGetMemoryInfo_v2", 74900},
    {"nvmlDeviceGetPersistenceMode", 27900},
    {"nvmlSystemGetCudaDriverVersion", 13000},
    {"nvmlSystemGetCudaDriverVersion_v2", 13000},
    {"nvmlSystemGetDriverVersion", 29400},
    {"nvmlDeviceGetPciInfo_v3", 6000},
    {"nvmlDeviceGetName", 6000},
    {"nvmlDeviceGetRemappedRows", 8400},
    {"nvmlDeviceGetUUID", 5000},
    {"nvmlDeviceGetHandleByIndex_v2", 4000},
    {"nvmlSystemGetNVMLVersion", 4000},
    {"nvmlDeviceGetTemperature", 6200},
    {"nvmlDeviceGetTotalEccErrors", 7000},
    {"nvmlDeviceGetCurrentClocksEventReasons", 7300},
    {"nvmlDeviceGetCurrentClocksThrottleReasons", 7300},
    {"nvmlDeviceGetUtilizationRates", 5500},
    {"nvmlDeviceGetPowerUsage", 5900},
    {"nvmlDeviceGetClockInfo", 4000},
    {"nvmlDeviceGetMaxPcieLinkGeneration", 3000},
    {"nvmlDeviceGetCudaComputeCapability", 3000},
    {"nvmlDeviceGetMaxPcieLinkWidth", 2000},
    {"nvmlDeviceGetCount_v2", 35200},
};
/* Field values cost more for some fields: the H100 took 4.33 ms for the energy field alone, 0.19 ms
 * for PCIe replays, 0.04 ms for the recovery action. The call's own figure covers the first field. */
/* GPM metrics: the H100's first nvmlGpmMetricsGet in a process (seven metrics, cold) took 5.79 ms;
 * inside the agent's tick a one-metric request took 6.1 us (mean of 30). A session's first request
 * is charged the cold figure in all; each later one 6.1 us per metric. */
#define SIM_REAL_GPM_COLD_NS 5788100LL

static long long sim_field_cost_ns(unsigned int field)
{
    switch (field) {
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
    case NVML_FI_DEV_ENERGY:
        return 4295000;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        return 155000;
    default:
        return 0;
    }
}
#define SIM_REAL_ATTACH_NS 10720000LL
#define SIM_REAL_NO_SAMPLES_NS 1550000LL
#define SIM_REAL_OTHER_NS 3000LL
#define SIM_MAX_COUNTED 96

static int sim_attached[SIM_MAX_GPUS];
static int sim_gpm_warm;
static unsigned long long sim_spent_ns;
static struct { const char *name; unsigned long long calls; } sim_counted[SIM_MAX_COUNTED];

/* The model: $NVMLSIM_LATENCY ("real" or "none"), else the scenario's latency.model, else real. */
static int sim_model_real(void)
{
    const char *env = getenv("NVMLSIM_LATENCY");
    const jval *model;

    if (env && *env)
        return strcmp(env, "none") != 0;
    model = j_get(j_get(sim_root, "latency"), "model");
    return !(model && model->type == J_STR && strcmp(model->str, "none") == 0);
}

/* A scenario's own figure (microseconds) for `key` in latency.calls, or -1. */
static long long sim_scenario_cost_ns(const char *section, const char *key)
{
    const jval *latency = j_get(sim_root, "latency");
    long long us;

    if (section)
        latency = j_get(latency, section);
    if (!sim_number(latency, key, &us))
        return -1;
    return us * 1000;
}

static long long sim_cost_ns(const char *function)
{
    long long ns = sim_scenario_cost_ns("calls", function);

    if (ns >= 0)
        return ns;
    if (!sim_model_real())
        return 0;
    for (size_t i = 0; i < sizeof(sim_real_costs) / sizeof(sim_real_costs[0]); i++)
        if (strcmp(sim_real_costs[i].name, function) == 0)
            return sim_real_costs[i].ns;
    return SIM_REAL_OTHER_NS;
}

static long long sim_attach_ns(void)
{
    long long ns = sim_scenario_cost_ns(NULL, "attach");

    if (ns >= 0)
        return ns;
    return sim_model_real() ? SIM_REAL_ATTACH_NS : 0;
}

/* Spends busy, as the driver would, until `ns` have passed since `start`: what the simulator did for the
 * call since then (looking at the scenario file, say) is part of the cost, not added to it. */
static void sim_spend_from(const struct timespec *start, long long ns)
{
    struct timespec now;

    if (ns <= 0)
        return;
    do
        clock_gettime(CLOCK_MONOTONIC, &now);
    while ((now.tv_sec - start->tv_sec) * 1000000000LL + (now.tv_nsec - start->tv_nsec) < ns);
    sim_spent_ns += (unsigned long long)ns;
}

static void sim_spend(long long ns)
{
    struct timespec start;

    clock_gettime(CLOCK_MONOTONIC, &start);
    sim_spend_from(&start, ns);
}

/* Counts one call of `function` (a __func__, so one address per function) and spends its cost, counted
 * from `entered` (when the call came in). */
static void sim_call_from(const char *function, const struct timespec *entered)
{
    sim_calls++;
    for (int i = 0; i < SIM_MAX_COUNTED; i++) {
        if (sim_counted[i].name == function || !sim_counted[i].name) {
            sim_counted[i].name = function;
            sim_counted[i].calls++;
            break;
        }
    }
    sim_spend_from(entered, sim_cost_ns(function));
}

static void sim_call(const char *function)
{
    struct timespec entered;

    clock_gettime(CLOCK_MONOTONIC, &entered);
    sim_call_from(function, &entered);
}

/*
 * Every device call starts here: counts the call, checks initialisation,
 * resolves the handle and applies injected errors. On success `dev` is set and
 * the caller holds sim_lock (released by SIM_RETURN).
 */
/* The driver version the session was initialised with: a library loaded before a driver upgrade
 * talks to the new kernel module, and the driver answers LIB_RM_VERSION_MISMATCH. */
static char sim_session_driver[96];

static void sim_remember_driver(void)
{
    const jval *version = j_get(sim_root, "driverVersion");
    snprintf(sim_session_driver, sizeof(sim_session_driver), "%s",
             version && version->type == J_STR ? version->str : "");
}

static int sim_driver_replaced(void)
{
    const jval *version = j_get(sim_root, "driverVersion");
    return version && version->type == J_STR && strcmp(version->str, sim_session_driver) != 0;
}

/* `fresh`: first read the scenario again if its file changed (see SIM_FRESH_DEVICE_CALL); that look at
 * the file is part of the call's modelled cost, which a real driver's own work is part of too. */
#define SIM_DEVICE_CALL_(handle, dev, fresh)                                  \
    sim_device dev;                                                           \
    nvmlReturn_t sim_rc_;                                                     \
    struct timespec sim_entered_;                                             \
    clock_gettime(CLOCK_MONOTONIC, &sim_entered_);                            \
    pthread_mutex_lock(&sim_lock);                                            \
    if ((fresh) && sim_init_refcount)                                         \
        sim_refresh();                                                        \
    sim_call_from(__func__, &sim_entered_);                                   \
    if (!sim_init_refcount)                                                   \
        SIM_RETURN(NVML_ERROR_UNINITIALIZED);                                 \
    if ((fresh) && sim_driver_replaced())                                     \
        SIM_RETURN(NVML_ERROR_LIB_RM_VERSION_MISMATCH);                       \
    if (!sim_resolve((handle), &dev))                                         \
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);                              \
    sim_rc_ = sim_injected(dev.gpu, __func__);                                \
    if (sim_rc_ == NVML_SUCCESS && dev.mig)                                   \
        sim_rc_ = sim_injected(dev.mig, __func__);                            \
    if (sim_rc_ != NVML_SUCCESS)                                              \
        SIM_RETURN(sim_rc_)

#define SIM_DEVICE_CALL(handle, dev) SIM_DEVICE_CALL_(handle, dev, 0)

/* A device call that first reads the scenario again if its file changed: a card's memory query,
 * which every reader asks each time, so that a changed file reaches a long-lived reader. */
#define SIM_FRESH_DEVICE_CALL(handle, dev) SIM_DEVICE_CALL_(handle, dev, 1)

#define SIM_SYSTEM_CALL()                                                     \
    nvmlReturn_t sim_rc_;                                                     \
    pthread_mutex_lock(&sim_lock);                                            \
    sim_call(__func__);                                                       \
    if (!sim_init_refcount)                                                   \
        SIM_RETURN(NVML_ERROR_UNINITIALIZED);                                 \
    sim_rc_ = sim_injected(sim_root, __func__);                               \
    if (sim_rc_ != NVML_SUCCESS)                                              \
        SIM_RETURN(sim_rc_)

#define SIM_RETURN(rc)                                                        \
    do {                                                                      \
        nvmlReturn_t sim_out_ = (rc);                                         \
        pthread_mutex_unlock(&sim_lock);                                      \
        return sim_out_;                                                      \
    } while (0)

/* Reads number `key` of the device (or MIG device) into *out, or answers NOT_SUPPORTED. */
#define SIM_NUMBER_OR_UNSUPPORTED(obj, key, out)                              \
    long long out;                                                            \
    if (!sim_number((obj), (key), &out))                                      \
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED)

/* ------------------------------------------------------- system and init */

SIM_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    const jval *init_error;

    (void)flags;
    pthread_mutex_lock(&sim_lock);
    if (sim_init_refcount == 0) {
        /* The scenario stays loaded across nvmlShutdown, so that an injected error's "times"
         * count survives a new session; a changed file is read again. */
        rc = sim_changed() ? sim_load() : NVML_SUCCESS;
        if (rc == NVML_SUCCESS) {
            init_error = j_get(sim_root, "initError");
            if (init_error && init_error->type == J_STR)
                rc = sim_error_code(init_error->str);
        }
        memset(sim_attached, 0, sizeof(sim_attached));
        sim_gpm_warm = 0;
        if (rc == NVML_SUCCESS)
            sim_remember_driver();
    }
    sim_call(__func__);
    if (rc == NVML_SUCCESS)
        sim_init_refcount++;
    pthread_mutex_unlock(&sim_lock);
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

SIM_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&sim_lock);
    sim_call(__func__);
    if (!sim_init_refcount)
        SIM_RETURN(NVML_ERROR_UNINITIALIZED);
    --sim_init_refcount;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof(sim_errors) / sizeof(sim_errors[0]); i++)
        if (sim_errors[i].code == result)
            return sim_errors[i].text;
    return "Unknown Error";
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    SIM_SYSTEM_CALL();
    SIM_RETURN(sim_copy_string(sim_root, "driverVersion", version, length));
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    SIM_SYSTEM_CALL();
    SIM_RETURN(sim_copy_string(sim_root, "nvmlVersion", version, length));
}

static nvmlReturn_t sim_cuda_driver_version(int *version)
{
    long long value;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!sim_number(sim_root, "cudaDriverVersion", &value))
        return NVML_ERROR_NOT_SUPPORTED;
    *version = (int)value;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    SIM_SYSTEM_CALL();
    SIM_RETURN(sim_cuda_driver_version(cudaDriverVersion));
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    SIM_SYSTEM_CALL();
    SIM_RETURN(sim_cuda_driver_version(cudaDriverVersion));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    SIM_SYSTEM_CALL();
    if (!deviceCount)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    sim_refresh();
    *deviceCount = sim_device_count;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc;

    pthread_mutex_lock(&sim_lock);
    sim_call(__func__);
    if (!sim_init_refcount)
        SIM_RETURN(NVML_ERROR_UNINITIALIZED);
    if (!device)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    sim_refresh();
    if (index >= sim_device_count)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    rc = sim_injected(sim_devices[index], __func__);
    if (rc != NVML_SUCCESS)
        SIM_RETURN(rc);
    if (!sim_attached[index]) {
        sim_attached[index] = 1;
        sim_spend(sim_attach_ns());
    }
    *device = (nvmlDevice_t)&sim_gpu_handles[index];
    SIM_RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------------- identity */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    SIM_DEVICE_CALL(device, dev);
    if (!index || dev.mig)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *index = dev.index;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_copy_string(dev.mig ? dev.mig : dev.gpu, "name", name, length));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_copy_string(dev.mig ? dev.mig : dev.gpu, "uuid", uuid, length));
}

/* Fills `pci` from a GPU's or an NVSwitch's "pciBusId", "pciDeviceId" and "pciSubSystemId". */
static nvmlReturn_t sim_fill_pci(const jval *obj, nvmlPciInfo_t *pci)
{
    const jval *bus_id = j_get(obj, "pciBusId");
    unsigned int domain = 0, bus = 0, slot = 0, function = 0;
    long long device_id = 0, subsystem_id = 0;

    if (!bus_id || bus_id->type != J_STR)
        return NVML_ERROR_NOT_SUPPORTED;
    if (sscanf(bus_id->str, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4 ||
        strlen(bus_id->str) >= NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE) {
        fprintf(stderr, "nvml-simulator: pciBusId \"%s\" is not DDDDDDDD:BB:DD.F\n", bus_id->str);
        return NVML_ERROR_UNKNOWN;
    }
    sim_number(obj, "pciDeviceId", &device_id);
    sim_number(obj, "pciSubSystemId", &subsystem_id);
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busId, sizeof(pci->busId), "%s", bus_id->str);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             domain & 0xffffu, bus, slot);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = slot;
    pci->pciDeviceId = (unsigned int)device_id;
    pci->pciSubSystemId = (unsigned int)subsystem_id;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    SIM_DEVICE_CALL(device, dev);
    if (!pci)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (dev.mig)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    SIM_RETURN(sim_fill_pci(dev.gpu, pci));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    const jval *cc;

    SIM_DEVICE_CALL(device, dev);
    if (!major || !minor)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    cc = j_get(dev.gpu, "computeCapability");
    if (j_len(cc) != 2)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *major = (int)j_at(cc, 0)->num;
    *minor = (int)j_at(cc, 1)->num;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_NUMBER_OR_UNSUPPORTED(dev.gpu, "architecture", value);
    if (!arch)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *arch = (nvmlDeviceArchitecture_t)value;
    SIM_RETURN(NVML_SUCCESS);
}

/* --------------------------------------------------- memory, clocks, power */

static nvmlReturn_t sim_memory(const sim_device *dev, unsigned long long *total, unsigned long long *reserved,
                               unsigned long long *free_bytes, unsigned long long *used)
{
    const jval *memory = j_get(dev->mig ? dev->mig : dev->gpu, "memory");
    long long t, f, r = 0, u;

    if (!sim_number(memory, "total", &t) || !sim_number(memory, "free", &f))
        return NVML_ERROR_NOT_SUPPORTED;
    sim_number(memory, "reserved", &r);
    if (!sim_number(memory, "used", &u))
        u = t - f - r;
    *total = (unsigned long long)t;
    *reserved = (unsigned long long)r;
    *free_bytes = (unsigned long long)f;
    *used = (unsigned long long)u;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    unsigned long long reserved;
    nvmlReturn_t rc;

    SIM_FRESH_DEVICE_CALL(device, dev);
    if (!memory)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    rc = sim_memory(&dev, &memory->total, &reserved, &memory->free, &memory->used);
    /* The v1 struct counts reserved memory as used. */
    if (rc == NVML_SUCCESS)
        memory->used += reserved;
    SIM_RETURN(rc);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    SIM_FRESH_DEVICE_CALL(device, dev);
    /* an error injected into the memory query strikes both of its versions */
    sim_rc_ = sim_injected(dev.mig ? dev.mig : dev.gpu, "nvmlDeviceGetMemoryInfo");
    if (sim_rc_ != NVML_SUCCESS)
        SIM_RETURN(sim_rc_);
    if (!memory)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2)
        SIM_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    SIM_RETURN(sim_memory(&dev, &memory->total, &memory->reserved, &memory->free, &memory->used));
}

/* A clock of the device from the scenario's `table` ("maxClocks" or "clocks"), or NOT_SUPPORTED. */
static nvmlReturn_t sim_clock(const sim_device *dev, const char *table, nvmlClockType_t type, unsigned int *clock)
{
    static const char *keys[] = {
        [NVML_CLOCK_GRAPHICS] = "graphics", [NVML_CLOCK_SM] = "sm",
        [NVML_CLOCK_MEM] = "memory", [NVML_CLOCK_VIDEO] = "video",
    };
    long long value;

    if (!clock || (unsigned int)type >= sizeof(keys) / sizeof(keys[0]))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (dev->mig || !sim_number(j_get(dev->gpu, table), keys[type], &value))
        return NVML_ERROR_NOT_SUPPORTED;
    *clock = (unsigned int)value;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_clock(&dev, "maxClocks", type, clock));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_clock(&dev, "clocks", type, clock));
}

/* Device queries that answer one scalar from a number in the scenario, converted by `convert`. */
#define SIM_SCALAR_QUERY(function, type, key, convert)                        \
    SIM_EXPORT nvmlReturn_t function(nvmlDevice_t device, type *out)          \
    {                                                                         \
        SIM_DEVICE_CALL(device, dev);                                         \
        if (dev.mig)                                                          \
            SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);                             \
        SIM_NUMBER_OR_UNSUPPORTED(dev.gpu, key, value);                       \
        if (!out)                                                             \
            SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);                          \
        *out = convert(value);                                                \
        SIM_RETURN(NVML_SUCCESS);                                             \
    }

#define SIM_AS_UINT(value) ((unsigned int)(value))
#define SIM_AS_ENABLE_STATE(value) ((value) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED)
#define SIM_UINT_QUERY(function, key) SIM_SCALAR_QUERY(function, unsigned int, key, SIM_AS_UINT)
#define SIM_ENABLE_STATE_QUERY(function, key) SIM_SCALAR_QUERY(function, nvmlEnableState_t, key, SIM_AS_ENABLE_STATE)

SIM_UINT_QUERY(nvmlDeviceGetPowerManagementLimit, "powerLimit")
SIM_UINT_QUERY(nvmlDeviceGetEnforcedPowerLimit, "powerLimit")
SIM_UINT_QUERY(nvmlDeviceGetPowerUsage, "powerUsage")
SIM_UINT_QUERY(nvmlDeviceGetMaxPcieLinkGeneration, "maxPcieGeneration")
SIM_UINT_QUERY(nvmlDeviceGetMaxPcieLinkWidth, "maxPcieWidth")
SIM_UINT_QUERY(nvmlDeviceGetMaxMigDeviceCount, "maxMigDevices")

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                                 unsigned int *temp)
{
    SIM_DEVICE_CALL(device, dev);
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    SIM_NUMBER_OR_UNSUPPORTED(dev.gpu, "temperature", value);
    *temp = (unsigned int)value;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    const jval *u;
    long long gpu, memory;

    SIM_DEVICE_CALL(device, dev);
    if (!utilization)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    u = j_get(dev.gpu, "utilization");
    /* a GPU with MIG on has no utilization of its own: nvidia-smi shows N/A */
    if (dev.mig || sim_mig_enabled(dev.gpu) || !sim_number(u, "gpu", &gpu) || !sim_number(u, "memory", &memory))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = (unsigned int)gpu;
    utilization->memory = (unsigned int)memory;
    SIM_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t sim_clocks_event_reasons(const sim_device *dev, unsigned long long *reasons)
{
    long long value;
    if (!reasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (dev->mig || !sim_number(dev->gpu, "clocksEventReasons", &value))
        return NVML_ERROR_NOT_SUPPORTED;
    *reasons = (unsigned long long)value;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_clocks_event_reasons(&dev, reasons));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_clocks_event_reasons(&dev, reasons));
}

/* -------------------------------------------------------------- health */

SIM_ENABLE_STATE_QUERY(nvmlDeviceGetPersistenceMode, "persistenceMode")
SIM_ENABLE_STATE_QUERY(nvmlDeviceGetRetiredPagesPendingStatus, "retiredPagesPending")

SIM_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
    const jval *ecc;
    long long cur, pend;

    SIM_DEVICE_CALL(device, dev);
    if (!current || !pending)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    ecc = j_get(dev.gpu, "ecc");
    if (!sim_number(ecc, "enabled", &cur))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (!sim_number(ecc, "pendingEnabled", &pend))
        pend = cur;
    *current = cur ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    *pending = pend ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                    nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    static const char *keys[2][2] = {
        {"correctedVolatile", "correctedAggregate"},
        {"uncorrectedVolatile", "uncorrectedAggregate"},
    };
    const jval *ecc;
    long long enabled, value;

    SIM_DEVICE_CALL(device, dev);
    if (!eccCounts || (unsigned int)errorType > 1 || (unsigned int)counterType > 1)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    ecc = j_get(dev.gpu, "ecc");
    if (!sim_number(ecc, "enabled", &enabled) || !enabled)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (!sim_number(ecc, keys[errorType][counterType], &value))
        value = 0;
    *eccCounts = (unsigned long long)value;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                                  unsigned int *isPending, unsigned int *failureOccurred)
{
    const jval *rows;
    long long corr = 0, unc = 0, pending = 0, failed = 0;

    SIM_DEVICE_CALL(device, dev);
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    rows = j_get(dev.gpu, "remappedRows");
    if (!rows)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    sim_number(rows, "correctable", &corr);
    sim_number(rows, "uncorrectable", &unc);
    sim_number(rows, "pending", &pending);
    sim_number(rows, "failed", &failed);
    *corrRows = (unsigned int)corr;
    *uncRows = (unsigned int)unc;
    *isPending = pending ? 1 : 0;
    *failureOccurred = failed ? 1 : 0;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    SIM_DEVICE_CALL(device, dev);
    if (!values || valuesCount < 0)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < valuesCount; i++) {
        long long value;
        char key[16];
        nvmlFieldValue_t *fv = &values[i];
        fv->timestamp = 0;
        fv->latencyUsec = 0;
        fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        snprintf(key, sizeof(key), "%u", fv->fieldId);
        if (sim_model_real() && sim_scenario_cost_ns("calls", "nvmlDeviceGetFieldValues") < 0)
            sim_spend(sim_field_cost_ns(fv->fieldId));
        if (fv->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION &&
            sim_number(dev.gpu, "recoveryAction", &value)) {
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            fv->value.uiVal = (unsigned int)value;
            fv->nvmlReturn = NVML_SUCCESS;
        } else if ((fv->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT &&
                    sim_number(j_get(dev.gpu, "nvlink"), "links", &value)) ||
                   (fv->fieldId == NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON &&
                    sim_number(j_get(dev.gpu, "nvlink"), "speedMBps", &value))) {
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            fv->value.uiVal = (unsigned int)value;
            fv->nvmlReturn = dev.mig ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
        } else if (sim_number(j_get(dev.gpu, "fields"), key, &value)) {
            /* "fields": {"82": 43, "83": 2742790, "94": 0}: NVML field ID to value */
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            fv->value.ullVal = (unsigned long long)value;
            fv->nvmlReturn = NVML_SUCCESS;
        }
    }
    SIM_RETURN(NVML_SUCCESS);
}

/* The counters dcgm-exporter serves by default, each from its NVML call. */
static nvmlReturn_t sim_field(const sim_device *dev, unsigned int field, unsigned long long *out)
{
    char key[16];
    long long value;

    snprintf(key, sizeof(key), "%u", field);
    if (dev->mig || !sim_number(j_get(dev->gpu, "fields"), key, &value))
        return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned long long)value;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    SIM_DEVICE_CALL(device, dev);
    if (!energy)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    SIM_RETURN(sim_field(&dev, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, energy));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
    unsigned long long replays = 0;
    nvmlReturn_t rc;

    SIM_DEVICE_CALL(device, dev);
    if (!value)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    rc = sim_field(&dev, NVML_FI_DEV_PCIE_REPLAY_COUNTER, &replays);
    *value = (unsigned int)replays;
    SIM_RETURN(rc);
}

static nvmlReturn_t sim_codec(const sim_device *dev, const char *key, unsigned int *utilization,
                              unsigned int *period)
{
    long long value;

    if (!utilization || !period)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* nvml.h: not supported on a GPU with MIG on, as its utilization rates */
    if (dev->mig || sim_mig_enabled(dev->gpu) || !sim_number(dev->gpu, key, &value))
        return NVML_ERROR_NOT_SUPPORTED;
    *utilization = (unsigned int)value;
    *period = 100000;       /* us, as the H100 reported it */
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                        unsigned int *samplingPeriodUs)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_codec(&dev, "encoderUtilization", utilization, samplingPeriodUs));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                        unsigned int *samplingPeriodUs)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_codec(&dev, "decoderUtilization", utilization, samplingPeriodUs));
}

/* A vGPU guest's licence: "vgpuLicensed": 1 is licensed, 0 not. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetGridLicensableFeatures_v4(nvmlDevice_t device,
                                                               nvmlGridLicensableFeatures_t *features)
{
    long long licensed;

    SIM_DEVICE_CALL(device, dev);
    if (!features)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!sim_number(dev.gpu, "vgpuLicensed", &licensed))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    memset(features, 0, sizeof(*features));
    features->isGridLicenseSupported = 1;
    features->licensableFeaturesCount = 1;
    features->gridLicensableFeatures[0].featureCode = NVML_GRID_LICENSE_FEATURE_CODE_VGPU;
    features->gridLicensableFeatures[0].featureState = licensed ? 1 : 0;
    features->gridLicensableFeatures[0].featureEnabled = 1;
    SIM_RETURN(NVML_SUCCESS);
}

/* "virtualizationMode": NVML_GPU_VIRTUALIZATION_MODE_* (0 none, 1 passthrough, 2 vGPU guest, ...). */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t device, nvmlGpuVirtualizationMode_t *mode)
{
    long long value = 0;

    SIM_DEVICE_CALL(device, dev);
    if (!mode)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    sim_number(dev.gpu, "virtualizationMode", &value);
    *mode = (nvmlGpuVirtualizationMode_t)value;
    SIM_RETURN(NVML_SUCCESS);
}

/* ----------------------------------------------------------------- MIG */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    const jval *mig;
    long long cur, pend;

    SIM_DEVICE_CALL(device, dev);
    if (!currentMode || !pendingMode)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    mig = j_get(dev.gpu, "migMode");
    if (dev.mig || !sim_number(mig, "current", &cur))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (!sim_number(mig, "pending", &pend))
        pend = cur;
    *currentMode = cur ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = pend ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    SIM_DEVICE_CALL(device, dev);
    if (!isMigDevice)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = dev.mig ? 1 : 0;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                           nvmlDevice_t *migDevice)
{
    long long max_devices, current = 0;

    SIM_DEVICE_CALL(device, dev);
    if (!migDevice || dev.mig)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    sim_number(j_get(dev.gpu, "migMode"), "current", &current);
    if (!current)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!sim_number(dev.gpu, "maxMigDevices", &max_devices) || max_devices > SIM_MAX_MIG)
        max_devices = SIM_MAX_MIG;
    if (index >= (unsigned long long)max_devices)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    {
        /* MIG devices are the entries with a compute instance, counted in order */
        unsigned int position = 0, seen = 0;
        const jval *entry = j_get(dev.gpu, "migDevices");
        for (entry = entry ? entry->child : NULL; entry; entry = entry->next, position++) {
            if (!j_get(entry, "computeInstanceId") || !sim_mig_reachable(sim_device_minor[dev.index], entry))
                continue;
            if (seen++ == index)
                break;
        }
        if (!entry || position >= SIM_MAX_MIG)
            SIM_RETURN(NVML_ERROR_NOT_FOUND);
        *migDevice = (nvmlDevice_t)&sim_mig_handles[dev.index][position];
    }
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    SIM_DEVICE_CALL(migDevice, dev);
    if (!device || !dev.mig)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *device = (nvmlDevice_t)&sim_gpu_handles[dev.index];
    SIM_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t sim_mig_number(const sim_device *dev, const char *key, unsigned int *out)
{
    long long value;
    if (!out || !dev->mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!sim_number(dev->mig, key, &value))
        return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)value;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_mig_number(&dev, "gpuInstanceId", id));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    SIM_DEVICE_CALL(device, dev);
    SIM_RETURN(sim_mig_number(&dev, "computeInstanceId", id));
}

/* ------------------------------------------------------ MIG management */

/*
 * GPU instance profiles of the cards that have MIG, as NVIDIA's MIG user guide tables them
 * (`nvidia-smi mig -lgip`). `size` is the memory slices an instance occupies and `starts` the
 * placements it may take; two instances conflict when their memory slices overlap.
 */
typedef struct {
    unsigned int profile;   /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned int id;        /* the profile's ID, which the create and list calls take */
    const char *name;
    unsigned int slices, instances, sms, copy, decoders, encoders, jpegs, ofas;
    unsigned long long memory_mb;
    unsigned int size;
    unsigned int starts[8];
    unsigned int start_count;
} sim_gi_profile;

static const sim_gi_profile sim_a100_40gb[] = {
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.5gb", 1, 7, 14, 1, 0, 0, 0, 0, 4864, 1, {0, 1, 2, 3, 4, 5, 6}, 7},
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 14, 1, 1, 0, 1, 1, 4864, 1, {0, 1, 2, 3, 4, 5, 6}, 7},
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.10gb", 1, 4, 14, 1, 1, 0, 0, 0, 9856, 2, {0, 2, 4, 6}, 4},
    {NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.10gb", 2, 3, 28, 2, 1, 0, 0, 0, 9856, 2, {0, 2, 4}, 3},
    {NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.20gb", 3, 2, 42, 3, 2, 0, 0, 0, 19968, 4, {0, 4}, 2},
    {NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.20gb", 4, 1, 56, 4, 2, 0, 0, 0, 19968, 4, {0}, 1},
    {NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.40gb", 7, 1, 98, 7, 5, 0, 1, 1, 40192, 8, {0}, 1},
};

static const sim_gi_profile sim_h100_80gb[] = {
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 1, 7, 16, 1, 1, 0, 1, 0, 9984, 1, {0, 1, 2, 3, 4, 5, 6}, 7},
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 16, 1, 1, 0, 1, 1, 9984, 1, {0, 1, 2, 3, 4, 5, 6}, 7},
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 4, 26, 1, 1, 0, 1, 0, 20096, 2, {0, 2, 4, 6}, 4},
    {NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 2, 3, 32, 2, 2, 0, 2, 0, 20096, 2, {0, 2, 4}, 3},
    {NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 3, 2, 60, 3, 3, 0, 3, 0, 40448, 4, {0, 4}, 2},
    {NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 4, 1, 64, 4, 4, 0, 4, 0, 40448, 4, {0}, 1},
    {NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 7, 1, 132, 8, 7, 0, 7, 1, 81152, 8, {0}, 1},
};

/* Blackwell's workstation and server card: four compute and four memory slices, 96 GB. */
static const sim_gi_profile sim_rtx_pro_6000[] = {
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE, 14, "1g.24gb", 1, 4, 46, 1, 1, 0, 1, 0, 24192, 1, {0, 1, 2, 3}, 4},
    {NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 21, "1g.24gb+me", 1, 1, 46, 1, 1, 0, 1, 1, 24192, 1, {0, 1, 2, 3}, 4},
    {NVML_GPU_INSTANCE_PROFILE_2_SLICE, 5, "2g.48gb", 2, 2, 94, 2, 2, 0, 2, 0, 48512, 2, {0, 2}, 2},
    {NVML_GPU_INSTANCE_PROFILE_4_SLICE, 0, "4g.96gb", 4, 1, 188, 4, 4, 0, 4, 1, 97024, 4, {0}, 1},
};

#define SIM_COUNT(a) (unsigned int)(sizeof(a) / sizeof((a)[0]))
#define SIM_SLICES_TOTAL 7

/* The profile table of a GPU, chosen by its name; NULL for a card without MIG. */
static const sim_gi_profile *sim_profiles(const jval *gpu, unsigned int *count)
{
    const jval *name = j_get(gpu, "name");

    if (!j_get(gpu, "migMode") || !name || name->type != J_STR)
        return NULL;
    if (strstr(name->str, "A100") && strstr(name->str, "40GB")) {
        *count = SIM_COUNT(sim_a100_40gb);
        return sim_a100_40gb;
    }
    if (strstr(name->str, "H100") && strstr(name->str, "80GB")) {
        *count = SIM_COUNT(sim_h100_80gb);
        return sim_h100_80gb;
    }
    if (strstr(name->str, "RTX PRO 6000")) {
        *count = SIM_COUNT(sim_rtx_pro_6000);
        return sim_rtx_pro_6000;
    }
    return NULL;
}

static const sim_gi_profile *sim_profile_where(const jval *gpu, int by_id, unsigned int value)
{
    unsigned int count = 0;
    const sim_gi_profile *table = sim_profiles(gpu, &count);

    for (unsigned int i = 0; table && i < count; i++)
        if ((by_id ? table[i].id : table[i].profile) == value)
            return &table[i];
    return NULL;
}

/* "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb" -> profile "3g.20gb", compute slices 1 (0: the whole GI). */
static const sim_gi_profile *sim_entry_profile(const jval *gpu, const jval *entry, unsigned int *ci_slices)
{
    const jval *name = j_get(entry, "name");
    const char *suffix;
    unsigned int count = 0;
    const sim_gi_profile *table = sim_profiles(gpu, &count);

    *ci_slices = 0;
    if (!table || !name || name->type != J_STR || !(suffix = strstr(name->str, " MIG ")))
        return NULL;
    suffix += 5;
    if (isdigit((unsigned char)suffix[0]) && suffix[1] == 'c' && suffix[2] == '.') {
        *ci_slices = (unsigned int)(suffix[0] - '0');
        suffix += 3;
    }
    for (unsigned int i = 0; i < count; i++)
        if (strcmp(table[i].name, suffix) == 0) {
            if (!*ci_slices)
                *ci_slices = table[i].slices;
            return &table[i];
        }
    return NULL;
}

static int sim_entry_number(const jval *entry, const char *key, long long fallback)
{
    long long value;
    return sim_number(entry, key, &value) ? (int)value : (int)fallback;
}

/* The first entry of GPU instance `gi_id`, or NULL. */
static const jval *sim_gi_entry(const jval *gpu, unsigned int gi_id)
{
    const jval *list = j_get(gpu, "migDevices");
    for (const jval *e = list ? list->child : NULL; e; e = e->next)
        if (sim_entry_number(e, "gpuInstanceId", -1) == (int)gi_id)
            return e;
    return NULL;
}

/*
 * Where each GPU instance sits: its "placement" when the scenario gives one, else the first
 * free start of its profile, in the order the instances are listed. Fills used[] with the
 * memory slices taken and returns the start of `gi_id` (or -1).
 */
static int sim_placements(const jval *gpu, int gi_id, unsigned char used[8])
{
    const jval *list = j_get(gpu, "migDevices");
    int found = -1;
    unsigned char seen[SIM_MAX_GI_ID] = {0};

    memset(used, 0, 8);
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0 lays out the instances with a placement, pass 1 the others */
        for (const jval *e = list ? list->child : NULL; e; e = e->next) {
            int id = sim_entry_number(e, "gpuInstanceId", -1), start = -1;
            unsigned int ci_slices;
            const sim_gi_profile *profile = sim_entry_profile(gpu, e, &ci_slices);
            long long given;

            if (id < 0 || id >= SIM_MAX_GI_ID || seen[id] || !profile)
                continue;
            if (sim_number(e, "placement", &given) != (pass == 0))
                continue;
            seen[id] = 1;
            if (pass == 0) {
                start = (int)given;
            } else {
                for (unsigned int s = 0; s < profile->start_count && start < 0; s++) {
                    int free = 1;
                    for (unsigned int k = 0; k < profile->size; k++)
                        free &= profile->starts[s] + k < 8 && !used[profile->starts[s] + k];
                    if (free)
                        start = (int)profile->starts[s];
                }
            }
            if (start < 0)
                continue;
            for (unsigned int k = 0; k < profile->size && start + (int)k < 8; k++)
                used[start + k] = 1;
            if (id == gi_id)
                found = start;
        }
    }
    return found;
}

static unsigned int sim_used_compute_slices(const jval *gpu)
{
    const jval *list = j_get(gpu, "migDevices");
    unsigned char seen[SIM_MAX_GI_ID] = {0};
    unsigned int total = 0, ci_slices;

    for (const jval *e = list ? list->child : NULL; e; e = e->next) {
        int id = sim_entry_number(e, "gpuInstanceId", -1);
        const sim_gi_profile *profile = sim_entry_profile(gpu, e, &ci_slices);
        if (id >= 0 && id < SIM_MAX_GI_ID && !seen[id] && profile) {
            seen[id] = 1;
            total += profile->slices;
        }
    }
    return total;
}

static unsigned int sim_instances_of(const jval *gpu, const sim_gi_profile *profile)
{
    const jval *list = j_get(gpu, "migDevices");
    unsigned char seen[SIM_MAX_GI_ID] = {0};
    unsigned int n = 0, ci_slices;

    for (const jval *e = list ? list->child : NULL; e; e = e->next) {
        int id = sim_entry_number(e, "gpuInstanceId", -1);
        if (id >= 0 && id < SIM_MAX_GI_ID && !seen[id] && sim_entry_profile(gpu, e, &ci_slices) == profile) {
            seen[id] = 1;
            n++;
        }
    }
    return n;
}

/* Whether `profile` fits at `start` beside the instances there are. */
static int sim_fits(const jval *gpu, const sim_gi_profile *profile, unsigned int start)
{
    unsigned char used[8];
    int allowed = 0;

    for (unsigned int s = 0; s < profile->start_count; s++)
        allowed |= profile->starts[s] == start;
    if (!allowed || sim_instances_of(gpu, profile) >= profile->instances ||
        sim_used_compute_slices(gpu) + profile->slices > SIM_SLICES_TOTAL)
        return 0;
    sim_placements(gpu, -1, used);
    for (unsigned int k = 0; k < profile->size; k++)
        if (start + k >= 8 || used[start + k])
            return 0;
    return 1;
}

static int sim_mig_enabled(const jval *gpu)
{
    long long current = 0;
    sim_number(j_get(gpu, "migMode"), "current", &current);
    return current != 0;
}

/* ---- writing the scenario back: a created or destroyed instance outlives the process, as on a driver */

static void j_dump_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void j_dump(FILE *f, const jval *v, int depth)
{
    switch (v->type) {
    case J_NULL:
        fputs("null", f);
        break;
    case J_BOOL:
        fputs(v->num ? "true" : "false", f);
        break;
    case J_NUM:
        fprintf(f, "%lld", v->num);
        break;
    case J_STR:
        j_dump_string(f, v->str);
        break;
    case J_ARR:
    case J_OBJ:
        fputc(v->type == J_ARR ? '[' : '{', f);
        for (const jval *c = v->child; c; c = c->next) {
            fprintf(f, "\n%*s", 2 * (depth + 1), "");
            if (v->type == J_OBJ) {
                j_dump_string(f, c->key);
                fputs(": ", f);
            }
            j_dump(f, c, depth + 1);
            if (c->next)
                fputc(',', f);
        }
        if (v->child)
            fprintf(f, "\n%*s", 2 * depth, "");
        fputc(v->type == J_ARR ? ']' : '}', f);
        break;
    }
}

/* Writes the scenario in memory over its file (beside it, then renamed), keeping it loaded. */
static nvmlReturn_t sim_save(void)
{
    const char *path = sim_config_path();
    char tmp[PATH_MAX];
    struct stat st;
    FILE *f;

    if (snprintf(tmp, sizeof(tmp), "%s.nvmlsim-%d", path, (int)getpid()) >= (int)sizeof(tmp) ||
        !(f = fopen(tmp, "w"))) {
        fprintf(stderr, "nvml-simulator: cannot write %s: %s\n", path, strerror(errno));
        return NVML_ERROR_NO_PERMISSION;
    }
    j_dump(f, sim_root, 0);
    fputc('\n', f);
    if (fclose(f) != 0 || rename(tmp, path) != 0 || stat(path, &st) != 0) {
        fprintf(stderr, "nvml-simulator: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return NVML_ERROR_UNKNOWN;
    }
    sim_loaded_mtime = st.st_mtim;
    sim_loaded_size = st.st_size;
    sim_loaded_ino = st.st_ino;
    return NVML_SUCCESS;
}

static jval *j_member(jval *obj, const char *key, jtype type)
{
    jval *m = (jval *)j_get(obj, key), **tail;

    if (m)
        return m;
    m = j_new(type);
    m->key = strdup(key);
    for (tail = &obj->child; *tail; tail = &(*tail)->next)
        ;
    *tail = m;
    return m;
}

static void j_set_number(jval *obj, const char *key, long long value)
{
    jval *m = j_member(obj, key, J_NUM);
    m->type = J_NUM;
    m->num = value;
}

static void j_set_string(jval *obj, const char *key, const char *value)
{
    jval *m = j_member(obj, key, J_STR);
    free(m->str);
    m->type = J_STR;
    m->str = strdup(value);
}

/* Removes the entries of `list` for which keep() says no; returns how many went. */
static unsigned int j_remove_where(jval *list, int gi_id, int ci_id)
{
    unsigned int removed = 0;
    for (jval **e = &list->child; *e;) {
        int gi = sim_entry_number(*e, "gpuInstanceId", -1), ci = sim_entry_number(*e, "computeInstanceId", -1);
        if (gi == gi_id && (ci_id < 0 || ci == ci_id || !j_get(*e, "computeInstanceId"))) {
            jval *gone = *e;
            *e = gone->next;
            gone->next = NULL;
            j_free(gone);
            removed++;
        } else {
            e = &(*e)->next;
        }
    }
    return removed;
}

/* A list call's answer: how many there are, and whether the caller's array held them all. */
static nvmlReturn_t sim_listed(unsigned int found, unsigned int *count)
{
    nvmlReturn_t rc = found > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = found;
    return rc;
}

/* ---- handles of GPU and compute instances */

typedef struct {
    unsigned int index;   /* the GPU */
    unsigned int gi_id;
    unsigned int ci_id;
    const jval *gpu;
    const jval *entry;    /* the first entry of the GPU instance, or the compute instance's */
    const sim_gi_profile *profile;
    unsigned int ci_slices;
} sim_instance;

static int sim_resolve_gi(nvmlGpuInstance_t handle, sim_instance *out)
{
    uintptr_t h = (uintptr_t)handle, base = (uintptr_t)sim_gi_handles;

    if (h < base || h >= base + sizeof(sim_gi_handles))
        return 0;
    out->index = (unsigned int)((h - base) / sizeof(sim_gi_handles[0]));
    out->gi_id = (unsigned int)((h - base) % sizeof(sim_gi_handles[0]) / sizeof(sim_gi_handles[0][0]));
    if (out->index >= sim_device_count)
        return 0;
    out->gpu = sim_devices[out->index];
    out->entry = sim_gi_entry(out->gpu, out->gi_id);
    out->profile = out->entry ? sim_entry_profile(out->gpu, out->entry, &out->ci_slices) : NULL;
    return out->profile != NULL;
}

static int sim_resolve_ci(nvmlComputeInstance_t handle, sim_instance *out)
{
    uintptr_t h = (uintptr_t)handle, base = (uintptr_t)sim_ci_handles;
    const jval *list;

    if (h < base || h >= base + sizeof(sim_ci_handles))
        return 0;
    h -= base;
    out->index = (unsigned int)(h / sizeof(sim_ci_handles[0]));
    out->gi_id = (unsigned int)(h % sizeof(sim_ci_handles[0]) / sizeof(sim_ci_handles[0][0]));
    out->ci_id = (unsigned int)(h % sizeof(sim_ci_handles[0][0]));
    if (out->index >= sim_device_count)
        return 0;
    out->gpu = sim_devices[out->index];
    list = j_get(out->gpu, "migDevices");
    for (const jval *e = list ? list->child : NULL; e; e = e->next)
        if (sim_entry_number(e, "gpuInstanceId", -1) == (int)out->gi_id &&
            sim_entry_number(e, "computeInstanceId", -1) == (int)out->ci_id) {
            out->entry = e;
            out->profile = sim_entry_profile(out->gpu, e, &out->ci_slices);
            return out->profile != NULL;
        }
    return 0;
}

#define SIM_INSTANCE_CALL(resolve, handle, inst)                              \
    sim_instance inst;                                                        \
    pthread_mutex_lock(&sim_lock);                                            \
    sim_call(__func__);                                                       \
    if (!sim_init_refcount)                                                   \
        SIM_RETURN(NVML_ERROR_UNINITIALIZED);                                 \
    if (!resolve((handle), &inst))                                            \
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);                              \
    if (sim_injected(inst.gpu, __func__) != NVML_SUCCESS)                     \
        SIM_RETURN(sim_injected(inst.gpu, __func__))

/* A device call that needs a full GPU whose MIG mode is on. */
#define SIM_MIG_GPU_CALL(handle, dev)                                         \
    SIM_DEVICE_CALL(handle, dev);                                             \
    if (dev.mig)                                                              \
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);                              \
    if (!sim_mig_enabled(dev.gpu) || !sim_profiles(dev.gpu, &(unsigned int){0})) \
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED)

/* ---- MIG mode */

SIM_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activationStatus)
{
    jval *mig;
    long long reset_required = 0;

    SIM_DEVICE_CALL(device, dev);
    if (dev.mig || !activationStatus || (mode != NVML_DEVICE_MIG_ENABLE && mode != NVML_DEVICE_MIG_DISABLE))
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    mig = (jval *)j_get(dev.gpu, "migMode");
    if (!mig)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (mode == NVML_DEVICE_MIG_DISABLE && j_len(j_get(dev.gpu, "migDevices")))
        SIM_RETURN(NVML_ERROR_IN_USE);
    j_set_number(mig, "pending", mode);
    /* The driver resets the GPU to apply the mode: it cannot while a process holds it, and some
     * systems (a VM whose hypervisor owns the reset) need a reboot. */
    sim_number(dev.gpu, "migResetRequired", &reset_required);
    if (reset_required)
        *activationStatus = NVML_ERROR_RESET_REQUIRED;
    else if (j_len(j_get(dev.gpu, "processes")))
        *activationStatus = NVML_ERROR_IN_USE;
    else {
        *activationStatus = NVML_SUCCESS;
        j_set_number(mig, "current", mode);
    }
    SIM_RETURN(sim_save());
}

/* ---- GPU instance profiles and placements */

static void sim_fill_gi_profile(const sim_gi_profile *p, unsigned int *id, unsigned int *slices,
                                unsigned int *instances, unsigned int *sms, unsigned int *copy,
                                unsigned int *dec, unsigned int *enc, unsigned int *jpeg, unsigned int *ofa,
                                unsigned long long *memory)
{
    *id = p->id;
    *slices = p->slices;
    *instances = p->instances;
    *sms = p->sms;
    *copy = p->copy;
    *dec = p->decoders;
    *enc = p->encoders;
    *jpeg = p->jpegs;
    *ofa = p->ofas;
    *memory = p->memory_mb;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                            nvmlGpuInstanceProfileInfo_t *info)
{
    const sim_gi_profile *p;

    SIM_MIG_GPU_CALL(device, dev);
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!(p = sim_profile_where(dev.gpu, 0, profile)))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    memset(info, 0, sizeof(*info));
    sim_fill_gi_profile(p, &info->id, &info->sliceCount, &info->instanceCount, &info->multiprocessorCount,
                        &info->copyEngineCount, &info->decoderCount, &info->encoderCount, &info->jpegCount,
                        &info->ofaCount, &info->memorySizeMB);
    SIM_RETURN(NVML_SUCCESS);
}

static nvmlReturn_t sim_gi_profile_v(const sim_gi_profile *p, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    unsigned int version = info->version;

    if (!p)
        return NVML_ERROR_NOT_SUPPORTED;
    if (version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        memset(v3, 0, sizeof(*v3));
        v3->version = version;
        sim_fill_gi_profile(p, &v3->id, &v3->sliceCount, &v3->instanceCount, &v3->multiprocessorCount,
                            &v3->copyEngineCount, &v3->decoderCount, &v3->encoderCount, &v3->jpegCount,
                            &v3->ofaCount, &v3->memorySizeMB);
        snprintf(v3->name, sizeof(v3->name), "MIG %s", p->name);
        return NVML_SUCCESS;
    }
    if (version != nvmlGpuInstanceProfileInfo_v2 && version != 0)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memset(info, 0, sizeof(*info));
    info->version = nvmlGpuInstanceProfileInfo_v2;
    sim_fill_gi_profile(p, &info->id, &info->sliceCount, &info->instanceCount, &info->multiprocessorCount,
                        &info->copyEngineCount, &info->decoderCount, &info->encoderCount, &info->jpegCount,
                        &info->ofaCount, &info->memorySizeMB);
    snprintf(info->name, sizeof(info->name), "MIG %s", p->name);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info)
{
    SIM_MIG_GPU_CALL(device, dev);
    if (!info || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    SIM_RETURN(sim_gi_profile_v(sim_profile_where(dev.gpu, 0, profile), info));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                                 nvmlGpuInstanceProfileInfo_v2_t *info)
{
    SIM_MIG_GPU_CALL(device, dev);
    if (!info)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    SIM_RETURN(sim_gi_profile_v(sim_profile_where(dev.gpu, 1, profileId), info));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                      nvmlGpuInstancePlacement_t *placements,
                                                                      unsigned int *count)
{
    const sim_gi_profile *p;

    SIM_MIG_GPU_CALL(device, dev);
    if (!count || !(p = sim_profile_where(dev.gpu, 1, profileId)))
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!placements) {
        *count = p->start_count;
        SIM_RETURN(NVML_SUCCESS);
    }
    if (*count < p->start_count) {
        *count = p->start_count;
        SIM_RETURN(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < p->start_count; i++) {
        placements[i].start = p->starts[i];
        placements[i].size = p->size;
    }
    *count = p->start_count;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                                  unsigned int *count)
{
    const sim_gi_profile *p;
    unsigned int n = 0;

    SIM_MIG_GPU_CALL(device, dev);
    if (!count || !(p = sim_profile_where(dev.gpu, 1, profileId)))
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < p->start_count; i++)
        n += (unsigned int)sim_fits(dev.gpu, p, p->starts[i]);
    if (n > p->instances - sim_instances_of(dev.gpu, p))
        n = p->instances - sim_instances_of(dev.gpu, p);
    *count = n;
    SIM_RETURN(NVML_SUCCESS);
}

/* ---- creating and destroying GPU instances */

static void sim_uuid(char *out, size_t size, const char *parent, unsigned int gi, unsigned int ci, int start)
{
    unsigned long long h = 1469598103934665603ULL;
    char seed[128];

    snprintf(seed, sizeof(seed), "%s/%u/%u/%d", parent, gi, ci, start);
    for (const char *c = seed; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    snprintf(out, size, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned int)(h >> 32), (unsigned int)(h >> 16) & 0xffff,
             0x5000 | ((unsigned int)h & 0x0fff), 0x8000 | ((unsigned int)(h >> 48) & 0x3fff),
             (h * 31) & 0xffffffffffffULL);
}

static nvmlReturn_t sim_create_gi(const sim_device *dev, const sim_gi_profile *p, int start,
                                  nvmlGpuInstance_t *out)
{
    jval *gpu = (jval *)dev->gpu, *list, *entry, *memory, **tail;
    const jval *parent_name = j_get(gpu, "name");
    unsigned int id;
    char name[128];

    if (start < 0) {
        for (unsigned int s = 0; s < p->start_count && start < 0; s++)
            if (sim_fits(gpu, p, p->starts[s]))
                start = (int)p->starts[s];
        if (start < 0)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    } else if (!sim_fits(gpu, p, (unsigned int)start)) {
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    /* the whole-GPU profile takes ID 0; the others the lowest free ID from 1 */
    for (id = p->slices == SIM_SLICES_TOTAL ? 0 : 1; id < SIM_MAX_GI_ID && sim_gi_entry(gpu, id); id++)
        ;
    if (id >= SIM_MAX_GI_ID || j_len(j_get(gpu, "migDevices")) >= SIM_MAX_MIG)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    list = j_member(gpu, "migDevices", J_ARR);
    entry = j_new(J_OBJ);
    snprintf(name, sizeof(name), "%s MIG %s", parent_name && parent_name->type == J_STR ? parent_name->str : "GPU",
             p->name);
    j_set_string(entry, "name", name);
    j_set_number(entry, "gpuInstanceId", id);
    j_set_number(entry, "placement", start);
    memory = j_member(entry, "memory", J_OBJ);
    j_set_number(memory, "total", (long long)(p->memory_mb << 20));
    j_set_number(memory, "free", (long long)(p->memory_mb << 20) - 13631488LL);
    j_member(entry, "processes", J_ARR);
    for (tail = &list->child; *tail; tail = &(*tail)->next)
        ;
    *tail = entry;
    if (out)
        *out = &sim_gi_handles[dev->index][id];
    return sim_save();
}

SIM_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                    nvmlGpuInstance_t *gpuInstance)
{
    const sim_gi_profile *p;

    SIM_MIG_GPU_CALL(device, dev);
    if (!gpuInstance || !(p = sim_profile_where(dev.gpu, 1, profileId)))
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    SIM_RETURN(sim_create_gi(&dev, p, -1, gpuInstance));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
                                                                 const nvmlGpuInstancePlacement_t *placement,
                                                                 nvmlGpuInstance_t *gpuInstance)
{
    const sim_gi_profile *p;

    SIM_MIG_GPU_CALL(device, dev);
    if (!gpuInstance || !placement || !(p = sim_profile_where(dev.gpu, 1, profileId)) || placement->size != p->size)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    SIM_RETURN(sim_create_gi(&dev, p, (int)placement->start, gpuInstance));
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    const jval *list;

    SIM_INSTANCE_CALL(sim_resolve_gi, gpuInstance, gi);
    list = j_get(gi.gpu, "migDevices");
    for (const jval *e = list->child; e; e = e->next)
        if (sim_entry_number(e, "gpuInstanceId", -1) == (int)gi.gi_id && j_get(e, "computeInstanceId"))
            SIM_RETURN(NVML_ERROR_IN_USE);
    j_remove_where((jval *)list, (int)gi.gi_id, -1);
    SIM_RETURN(sim_save());
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                                  nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    const sim_gi_profile *p;
    const jval *list;
    unsigned char seen[SIM_MAX_GI_ID] = {0};
    unsigned int n = 0, ci_slices;

    SIM_MIG_GPU_CALL(device, dev);
    if (!count || !gpuInstances || !(p = sim_profile_where(dev.gpu, 1, profileId)))
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    list = j_get(dev.gpu, "migDevices");
    for (const jval *e = list ? list->child : NULL; e; e = e->next) {
        int id = sim_entry_number(e, "gpuInstanceId", -1);
        if (id < 0 || id >= SIM_MAX_GI_ID || seen[id] || sim_entry_profile(dev.gpu, e, &ci_slices) != p)
            continue;
        seen[id] = 1;
        if (n < *count)
            gpuInstances[n] = &sim_gi_handles[dev.index][id];
        n++;
    }
    SIM_RETURN(sim_listed(n, count));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                     nvmlGpuInstance_t *gpuInstance)
{
    unsigned int ci_slices;
    const jval *entry;

    SIM_MIG_GPU_CALL(device, dev);
    if (!gpuInstance || id >= SIM_MAX_GI_ID)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    entry = sim_gi_entry(dev.gpu, id);
    if (!entry || !sim_entry_profile(dev.gpu, entry, &ci_slices))
        SIM_RETURN(NVML_ERROR_NOT_FOUND);
    *gpuInstance = &sim_gi_handles[dev.index][id];
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    unsigned char used[8];

    SIM_INSTANCE_CALL(sim_resolve_gi, gpuInstance, gi);
    if (!info)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    memset(info, 0, sizeof(*info));
    info->device = (nvmlDevice_t)&sim_gpu_handles[gi.index];
    info->id = gi.gi_id;
    info->profileId = gi.profile->id;
    info->placement.start = (unsigned int)sim_placements(gi.gpu, (int)gi.gi_id, used);
    info->placement.size = gi.profile->size;
    SIM_RETURN(NVML_SUCCESS);
}

/* ---- compute instances: a compute instance profile's index is also its ID */

static const unsigned int sim_ci_slices_of[NVML_COMPUTE_INSTANCE_PROFILE_COUNT] = {1, 2, 3, 4, 7, 8, 6, 0, 0};

static int sim_ci_profile_of_slices(unsigned int slices)
{
    for (unsigned int i = 0; i < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; i++)
        if (sim_ci_slices_of[i] == slices)
            return (int)i;
    return -1;
}

static nvmlReturn_t sim_fill_ci_profile(const sim_instance *gi, unsigned int profile, unsigned int eng,
                                        nvmlComputeInstanceProfileInfo_v2_t *info)
{
    unsigned int slices;

    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT || eng >= NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    slices = sim_ci_slices_of[profile];
    if (!slices || slices > gi->profile->slices)
        return NVML_ERROR_NOT_SUPPORTED;
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = gi->profile->slices / slices;
    info->multiprocessorCount = gi->profile->sms * slices / gi->profile->slices;
    info->sharedCopyEngineCount = gi->profile->copy;
    info->sharedDecoderCount = gi->profile->decoders;
    info->sharedEncoderCount = gi->profile->encoders;
    info->sharedJpegCount = gi->profile->jpegs;
    info->sharedOfaCount = gi->profile->ofas;
    if (slices == gi->profile->slices)
        snprintf(info->name, sizeof(info->name), "MIG %s", gi->profile->name);
    else
        snprintf(info->name, sizeof(info->name), "MIG %uc.%s", slices, gi->profile->name);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                     unsigned int engProfile,
                                                                     nvmlComputeInstanceProfileInfo_t *info)
{
    nvmlComputeInstanceProfileInfo_v2_t full = {0};
    nvmlReturn_t rc;

    SIM_INSTANCE_CALL(sim_resolve_gi, gpuInstance, gi);
    if (!info)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    rc = sim_fill_ci_profile(&gi, profile, engProfile, &full);
    if (rc == NVML_SUCCESS) {
        info->id = full.id;
        info->sliceCount = full.sliceCount;
        info->instanceCount = full.instanceCount;
        info->multiprocessorCount = full.multiprocessorCount;
        info->sharedCopyEngineCount = full.sharedCopyEngineCount;
        info->sharedDecoderCount = full.sharedDecoderCount;
        info->sharedEncoderCount = full.sharedEncoderCount;
        info->sharedJpegCount = full.sharedJpegCount;
        info->sharedOfaCount = full.sharedOfaCount;
    }
    SIM_RETURN(rc);
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance,
                                                                      unsigned int profile, unsigned int engProfile,
                                                                      nvmlComputeInstanceProfileInfo_v2_t *info)
{
    unsigned int version;
    nvmlReturn_t rc;

    SIM_INSTANCE_CALL(sim_resolve_gi, gpuInstance, gi);
    if (!info)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    version = info->version;
    if (version != 0 && version != nvmlComputeInstanceProfileInfo_v2 && version != nvmlComputeInstanceProfileInfo_v3)
        SIM_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memset(info, 0, version == nvmlComputeInstanceProfileInfo_v3 ? sizeof(nvmlComputeInstanceProfileInfo_v3_t)
                                                                 : sizeof(*info));
    rc = sim_fill_ci_profile(&gi, profile, engProfile, info);
    info->version = version ? version : nvmlComputeInstanceProfileInfo_v2;
    SIM_RETURN(rc);
}

static unsigned int sim_ci_used_slices(const sim_instance *gi, unsigned char used[8])
{
    const jval *list = j_get(gi->gpu, "migDevices");
    unsigned int total = 0;

    memset(used, 0, 8);
    for (const jval *e = list ? list->child : NULL; e; e = e->next) {
        unsigned int ci_slices;
        long long start;
        if (sim_entry_number(e, "gpuInstanceId", -1) != (int)gi->gi_id || !j_get(e, "computeInstanceId"))
            continue;
        sim_entry_profile(gi->gpu, e, &ci_slices);
        if (!sim_number(e, "computePlacement", &start))
            start = total;
        for (unsigned int k = 0; k < ci_slices && start + k < 8; k++)
            used[start + k] = 1;
        total += ci_slices;
    }
    return total;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                           unsigned int profileId, unsigned int *count)
{
    unsigned char used[8];
    unsigned int slices;

    SIM_INSTANCE_CALL(sim_resolve_gi, gpuInstance, gi);
    if (!count || profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    slices = sim_ci_slices_of[profileId];
    if (!slices || slices > gi.profile->slices)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *count = (gi.profile->slices - sim_ci_used_slices(&gi, used)) / slices;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                             nvmlComputeInstance_t *computeInstance)
{
    unsigned char used[8];
    unsigned int slices, ci_id = 0, start = 0;
    jval *list, *entry;
    const jval *first, *parent_uuid;
    char name[128], uuid[64];

    SIM_INSTANCE_CALL(sim_resolve_gi, gpuInstance, gi);
    if (!computeInstance || profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    slices = sim_ci_slices_of[profileId];
    if (!slices || slices > gi.profile->slices)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (sim_ci_used_slices(&gi, used) + slices > gi.profile->slices)
        SIM_RETURN(NVML_ERROR_INSUFFICIENT_RESOURCES);
    while (start < 8 && used[start])
        start++;
    list = (jval *)j_get(gi.gpu, "migDevices");
    for (const jval *e = list->child; e; e = e->next)
        if (sim_entry_number(e, "gpuInstanceId", -1) == (int)gi.gi_id &&
            sim_entry_number(e, "computeInstanceId", -1) >= (int)ci_id)
            ci_id = (unsigned int)sim_entry_number(e, "computeInstanceId", -1) + 1;
    if (ci_id >= SIM_MAX_CI_ID)
        SIM_RETURN(NVML_ERROR_INSUFFICIENT_RESOURCES);
    /* the GPU instance's bare entry becomes its first compute instance; later ones are copies */
    first = gi.entry;
    if (j_get(first, "computeInstanceId")) {
        jval **tail;
        const jval *memory = j_get(first, "memory");
        entry = j_new(J_OBJ);
        j_set_number(entry, "gpuInstanceId", gi.gi_id);
        j_set_number(entry, "placement", sim_entry_number(first, "placement", 0));
        if (memory) {
            jval *m = j_member(entry, "memory", J_OBJ);
            j_set_number(m, "total", sim_entry_number(memory, "total", 0));
            j_set_number(m, "free", sim_entry_number(memory, "free", 0));
        }
        j_member(entry, "processes", J_ARR);
        for (tail = &list->child; *tail; tail = &(*tail)->next)
            ;
        *tail = entry;
    } else {
        entry = (jval *)first;
    }
    parent_uuid = j_get(gi.gpu, "uuid");
    {
        const jval *parent_name = j_get(gi.gpu, "name");
        const char *pn = parent_name && parent_name->type == J_STR ? parent_name->str : "GPU";
        if (slices == gi.profile->slices)
            snprintf(name, sizeof(name), "%s MIG %s", pn, gi.profile->name);
        else
            snprintf(name, sizeof(name), "%s MIG %uc.%s", pn, slices, gi.profile->name);
    }
    j_set_string(entry, "name", name);
    sim_uuid(uuid, sizeof(uuid), parent_uuid && parent_uuid->type == J_STR ? parent_uuid->str : "", gi.gi_id, ci_id,
             sim_entry_number(first, "placement", 0));
    j_set_string(entry, "uuid", uuid);
    j_set_number(entry, "computeInstanceId", ci_id);
    j_set_number(entry, "computePlacement", start);
    *computeInstance = &sim_ci_handles[gi.index][gi.gi_id][ci_id];
    SIM_RETURN(sim_save());
}

SIM_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    jval *list;
    unsigned int left = 0;

    SIM_INSTANCE_CALL(sim_resolve_ci, computeInstance, ci);
    if (j_len(j_get(ci.entry, "processes")))
        SIM_RETURN(NVML_ERROR_IN_USE);
    list = (jval *)j_get(ci.gpu, "migDevices");
    for (const jval *e = list->child; e; e = e->next)
        left += sim_entry_number(e, "gpuInstanceId", -1) == (int)ci.gi_id;
    if (left > 1) {
        j_remove_where(list, (int)ci.gi_id, (int)ci.ci_id);
    } else {
        /* the last compute instance leaves its GPU instance bare */
        jval *entry = (jval *)ci.entry;
        for (jval **m = &entry->child; *m;) {
            if (strcmp((*m)->key, "computeInstanceId") == 0 || strcmp((*m)->key, "uuid") == 0 ||
                strcmp((*m)->key, "computePlacement") == 0) {
                jval *gone = *m;
                *m = gone->next;
                gone->next = NULL;
                j_free(gone);
            } else {
                m = &(*m)->next;
            }
        }
        {
            const jval *parent_name = j_get(ci.gpu, "name");
            char name[128];
            snprintf(name, sizeof(name), "%s MIG %s",
                     parent_name && parent_name->type == J_STR ? parent_name->str : "GPU", ci.profile->name);
            j_set_string(entry, "name", name);
        }
    }
    SIM_RETURN(sim_save());
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                           nvmlComputeInstance_t *computeInstances,
                                                           unsigned int *count)
{
    const jval *list;
    unsigned int n = 0;

    SIM_INSTANCE_CALL(sim_resolve_gi, gpuInstance, gi);
    if (!count || !computeInstances || profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    list = j_get(gi.gpu, "migDevices");
    for (const jval *e = list->child; e; e = e->next) {
        unsigned int ci_slices;
        int ci_id = sim_entry_number(e, "computeInstanceId", -1);
        if (sim_entry_number(e, "gpuInstanceId", -1) != (int)gi.gi_id || ci_id < 0 || ci_id >= SIM_MAX_CI_ID)
            continue;
        sim_entry_profile(gi.gpu, e, &ci_slices);
        if (sim_ci_profile_of_slices(ci_slices) != (int)profileId)
            continue;
        if (n < *count)
            computeInstances[n] = &sim_ci_handles[gi.index][gi.gi_id][ci_id];
        n++;
    }
    SIM_RETURN(sim_listed(n, count));
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                              nvmlComputeInstance_t *computeInstance)
{
    const jval *list;

    SIM_INSTANCE_CALL(sim_resolve_gi, gpuInstance, gi);
    if (!computeInstance || id >= SIM_MAX_CI_ID)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    list = j_get(gi.gpu, "migDevices");
    for (const jval *e = list->child; e; e = e->next)
        if (sim_entry_number(e, "gpuInstanceId", -1) == (int)gi.gi_id &&
            sim_entry_number(e, "computeInstanceId", -1) == (int)id) {
            *computeInstance = &sim_ci_handles[gi.index][gi.gi_id][id];
            SIM_RETURN(NVML_SUCCESS);
        }
    SIM_RETURN(NVML_ERROR_NOT_FOUND);
}

SIM_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                      nvmlComputeInstanceInfo_t *info)
{
    long long start = 0;

    SIM_INSTANCE_CALL(sim_resolve_ci, computeInstance, ci);
    if (!info)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    sim_number(ci.entry, "computePlacement", &start);
    memset(info, 0, sizeof(*info));
    info->device = (nvmlDevice_t)&sim_gpu_handles[ci.index];
    info->gpuInstance = &sim_gi_handles[ci.index][ci.gi_id];
    info->id = ci.ci_id;
    info->profileId = (unsigned int)sim_ci_profile_of_slices(ci.ci_slices);
    info->placement.start = (unsigned int)start;
    info->placement.size = ci.ci_slices;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                                   nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}

/* ---- a MIG device's share of the GPU */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    const sim_gi_profile *p;
    unsigned int ci_slices;

    SIM_DEVICE_CALL(device, dev);
    if (!attributes)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev.mig || !(p = sim_entry_profile(dev.gpu, dev.mig, &ci_slices)))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    memset(attributes, 0, sizeof(*attributes));
    attributes->multiprocessorCount = p->sms * ci_slices / p->slices;
    attributes->sharedCopyEngineCount = p->copy;
    attributes->sharedDecoderCount = p->decoders;
    attributes->sharedEncoderCount = p->encoders;
    attributes->sharedJpegCount = p->jpegs;
    attributes->sharedOfaCount = p->ofas;
    attributes->gpuInstanceSliceCount = p->slices;
    attributes->computeInstanceSliceCount = ci_slices;
    attributes->memorySizeMB = p->memory_mb;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* ------------------------------------------- what NVIDIA's device plugin asks */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    SIM_DEVICE_CALL(device, dev);
    if (!minorNumber || dev.mig)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *minorNumber = sim_device_minor[dev.index];
    SIM_RETURN(NVML_SUCCESS);
}

/* The handle of GPU `index`, found by a lookup other than its index: a GPU lost to its index lookup is
 * lost to every other one too. */
static nvmlReturn_t sim_gpu_found(unsigned int index, nvmlDevice_t *device)
{
    if (sim_injected(sim_devices[index], "nvmlDeviceGetHandleByIndex_v2") == NVML_ERROR_GPU_IS_LOST)
        return NVML_ERROR_GPU_IS_LOST;
    *device = (nvmlDevice_t)&sim_gpu_handles[index];
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    SIM_SYSTEM_CALL();
    if (!uuid || !device)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < sim_device_count; i++) {
        const jval *id = j_get(sim_devices[i], "uuid"), *list = j_get(sim_devices[i], "migDevices");
        unsigned int position = 0;
        if (id && id->type == J_STR && strcmp(id->str, uuid) == 0) {
            SIM_RETURN(sim_gpu_found(i, device));
        }
        for (const jval *e = list ? list->child : NULL; e && position < SIM_MAX_MIG; e = e->next, position++) {
            const jval *mig_id = j_get(e, "uuid");
            if (mig_id && mig_id->type == J_STR && strcmp(mig_id->str, uuid) == 0 && j_get(e, "computeInstanceId")
                && sim_mig_reachable(sim_device_minor[i], e)) {
                *device = (nvmlDevice_t)&sim_mig_handles[i][position];
                SIM_RETURN(NVML_SUCCESS);
            }
        }
    }
    SIM_RETURN(NVML_ERROR_NOT_FOUND);
}

/* Parses a PCI bus ID as the driver accepts it: "domain:bus:device.function" (a domain of 4 or 8 hex
 * digits) or "bus:device.function" in domain 0, hex digits in either case. */
static int sim_parse_bus_id(const char *text, unsigned int out[4])
{
    int used = 0;

    if (sscanf(text, "%x:%x:%x.%x%n", &out[0], &out[1], &out[2], &out[3], &used) == 4 && !text[used])
        return 1;
    out[0] = 0;
    used = 0;
    return sscanf(text, "%x:%x.%x%n", &out[1], &out[2], &out[3], &used) == 3 && !text[used];
}

/* A GPU by its PCI bus ID, in any form sim_parse_bus_id accepts; MIG devices have none of their own. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned int wanted[4], have[4];

    SIM_SYSTEM_CALL();
    if (!pciBusId || !device || !sim_parse_bus_id(pciBusId, wanted))
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < sim_device_count; i++) {
        const jval *id = j_get(sim_devices[i], "pciBusId");
        if (!id || id->type != J_STR || !sim_parse_bus_id(id->str, have) || memcmp(have, wanted, sizeof(have)))
            continue;
        SIM_RETURN(sim_gpu_found(i, device));
    }
    SIM_RETURN(NVML_ERROR_NOT_FOUND);
}

/* "topology": {"<other GPU's index>": 10, ...} gives NVML_TOPOLOGY_* levels; unlisted pairs are SYSTEM. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                            nvmlGpuTopologyLevel_t *pathInfo)
{
    sim_device other;
    char key[16];

    SIM_DEVICE_CALL(device1, dev);
    if (!pathInfo || dev.mig || !sim_resolve(device2, &other) || other.mig)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    snprintf(key, sizeof(key), "%u", other.index);
    *pathInfo = other.index == dev.index ? NVML_TOPOLOGY_INTERNAL
                                         : (nvmlGpuTopologyLevel_t)sim_entry_number(j_get(dev.gpu, "topology"), key,
                                                                                    NVML_TOPOLOGY_SYSTEM);
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                               nvmlGpuP2PCapsIndex_t p2pIndex, nvmlGpuP2PStatus_t *p2pStatus)
{
    sim_device other;

    SIM_DEVICE_CALL(device1, dev);
    if (!p2pStatus || !sim_resolve(device2, &other))
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    /* GPUs on one NVSwitch board reach each other over NVLink; nothing else is peer to peer here */
    *p2pStatus = p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK && !dev.mig && !other.mig && j_get(dev.gpu, "nvlink") &&
                 j_get(other.gpu, "nvlink") && j_len(j_get(sim_root, "nvswitches"))
                     ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    SIM_RETURN(NVML_SUCCESS);
}

/* -------------------------------------------------------------- NVLink */

/*
 * "nvlink": {"links": 18, "version": 6, "speedMBps": 26562, "down": [4]} gives a GPU its NVLinks (an
 * SXM card's; a PCIe card has none and answers NOT_SUPPORTED). Every link is up but those in "down".
 * The scenario's top-level "nvswitches" ([{"pciBusId": ..., "pciDeviceId": ...}]) are the NVSwitch
 * chips of an HGX board: link i of a GPU goes to switch i * switches / links, so that 18 links over 4
 * switches split 5, 4, 5, 4 as on an HGX H100. Without switches the links go to the other GPUs.
 */
static const jval *sim_nvlink(const sim_device *dev, unsigned int link, nvmlReturn_t *rc)
{
    const jval *nvlink = dev->mig ? NULL : j_get(dev->gpu, "nvlink");
    long long links = 0;

    *rc = NVML_SUCCESS;
    if (!nvlink || !sim_number(nvlink, "links", &links))
        *rc = NVML_ERROR_NOT_SUPPORTED;
    else if (link >= (unsigned long long)links)
        *rc = NVML_ERROR_INVALID_ARGUMENT;
    return *rc == NVML_SUCCESS ? nvlink : NULL;
}

static int sim_link_down(const jval *nvlink, unsigned int link)
{
    const jval *down = j_get(nvlink, "down");

    for (const jval *e = down && down->type == J_ARR ? down->child : NULL; e; e = e->next)
        if (e->type == J_NUM && e->num == (long long)link)
            return 1;
    return 0;
}

/* The NVSwitch at the far end of `link`, or NULL on a board without switches. */
static const jval *sim_link_switch(const jval *nvlink, unsigned int link)
{
    const jval *switches = j_get(sim_root, "nvswitches");
    unsigned int count = j_len(switches);
    long long links = 1;

    if (!count)
        return NULL;
    sim_number(nvlink, "links", &links);
    return j_at(switches, (unsigned int)((unsigned long long)link * count / (unsigned long long)links));
}

/* "switchTray": 1, a rack's GPU (GB200 NVL72) whose NVSwitches sit in other trays, off this host's PCI bus */
static int sim_switch_tray(const jval *nvlink)
{
    long long tray = 0;

    return sim_number(nvlink, "switchTray", &tray) && tray;
}

/* The preamble of a per-link call: the device, its "nvlink" (else NOT_SUPPORTED), the link within it (else
 * INVALID_ARGUMENT) and a non-NULL output. */
#define SIM_NVLINK_CALL(handle, link, out, dev, nvlink)                       \
    const jval *nvlink;                                                       \
    nvmlReturn_t sim_link_rc_;                                                \
    SIM_DEVICE_CALL(handle, dev);                                             \
    nvlink = sim_nvlink(&dev, (link), &sim_link_rc_);                         \
    if (!nvlink)                                                              \
        SIM_RETURN(sim_link_rc_);                                             \
    if (!(out))                                                               \
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT)

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    SIM_NVLINK_CALL(device, link, isActive, dev, nvlink);
    *isActive = sim_link_down(nvlink, link) ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    long long value = 0;

    SIM_NVLINK_CALL(device, link, version, dev, nvlink);
    if (!sim_number(nvlink, "version", &value))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    *version = (unsigned int)value;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                            nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType)
{
    SIM_NVLINK_CALL(device, link, pNvLinkDeviceType, dev, nvlink);
    *pNvLinkDeviceType = sim_link_switch(nvlink, link) || sim_switch_tray(nvlink) ? NVML_NVLINK_DEVICE_TYPE_SWITCH
                                                                                  : NVML_NVLINK_DEVICE_TYPE_GPU;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)
{
    const jval *remote;

    SIM_NVLINK_CALL(device, link, pci, dev, nvlink);
    remote = sim_link_switch(nvlink, link);
    if (!remote && sim_switch_tray(nvlink))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    if (!remote)   /* no switches: the links go round the other GPUs */
        remote = sim_devices[(dev.index + 1 + link % (sim_device_count > 1 ? sim_device_count - 1 : 1))
                             % sim_device_count];
    SIM_RETURN(sim_fill_pci(remote, pci));
}

/* ---------------------------------------------------------- GPU fabric */

/*
 * "fabric": {"state": 3, "status": "SUCCESS", "cliqueId": 0, "clusterUuid": "…", "healthMask": 0,
 * "healthSummary": 1} is a Hopper or later GPU's place in the NVLink fabric (nvmlGpuFabricInfo_t):
 * state 1 not started, 2 in progress (Fabric Manager is training the fabric), 3 completed; status an
 * nvmlReturn_t name, meaningful once completed. No "fabric": NOT_SUPPORTED, as a PCIe card answers.
 */
/* The GPU's fabric info in its richest form (version 3); the older forms are its prefixes or a subset. */
static nvmlReturn_t sim_fabric(const sim_device *dev, nvmlGpuFabricInfo_v3_t *out)
{
    const jval *fabric = dev->mig ? NULL : j_get(dev->gpu, "fabric");
    const jval *status, *uuid;
    long long value = 0;
    unsigned int byte, i = 0;

    if (!fabric)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(out, 0, sizeof(*out));
    out->version = nvmlGpuFabricInfo_v3;
    if (sim_number(fabric, "state", &value))
        out->state = (nvmlGpuFabricState_t)value;
    if (sim_number(fabric, "cliqueId", &value))
        out->cliqueId = (unsigned int)value;
    if (sim_number(fabric, "healthMask", &value))
        out->healthMask = (unsigned int)value;
    if (sim_number(fabric, "healthSummary", &value))
        out->healthSummary = (unsigned char)value;
    status = j_get(fabric, "status");
    out->status = status && status->type == J_STR ? sim_error_code(status->str) : NVML_SUCCESS;
    uuid = j_get(fabric, "clusterUuid");
    for (const char *c = uuid && uuid->type == J_STR ? uuid->str : ""; *c && i < NVML_GPU_FABRIC_UUID_LEN; c++) {
        if (*c == '-')
            continue;
        if (sscanf(c, "%2x", &byte) != 1)
            return NVML_ERROR_UNKNOWN;
        out->clusterUuid[i++] = (unsigned char)byte;
        c++;
    }
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    nvmlGpuFabricInfo_v3_t f;
    nvmlReturn_t rc;

    SIM_DEVICE_CALL(device, dev);
    if (!gpuFabricInfo)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    rc = sim_fabric(&dev, &f);
    if (rc != NVML_SUCCESS)
        SIM_RETURN(rc);
    memcpy(gpuFabricInfo->clusterUuid, f.clusterUuid, sizeof(f.clusterUuid));
    gpuFabricInfo->status = f.status;
    gpuFabricInfo->cliqueId = f.cliqueId;
    gpuFabricInfo->state = f.state;
    SIM_RETURN(NVML_SUCCESS);
}

/* Version 2 is version 3 without the health summary at its end. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    nvmlGpuFabricInfo_v3_t f;
    nvmlReturn_t rc;

    SIM_DEVICE_CALL(device, dev);
    if (!gpuFabricInfo)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (gpuFabricInfo->version != nvmlGpuFabricInfo_v2 && gpuFabricInfo->version != nvmlGpuFabricInfo_v3)
        SIM_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    rc = sim_fabric(&dev, &f);
    if (rc != NVML_SUCCESS)
        SIM_RETURN(rc);
    f.version = gpuFabricInfo->version;
    memcpy(gpuFabricInfo, &f, f.version == nvmlGpuFabricInfo_v2 ? sizeof(nvmlGpuFabricInfo_v2_t) : sizeof(f));
    SIM_RETURN(NVML_SUCCESS);
}

/* ----------------------------------------------------------- processes */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos)
{
    const jval *list;
    unsigned int n, i = 0;

    SIM_DEVICE_CALL(device, dev);
    if (!infoCount)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    list = j_get(dev.mig ? dev.mig : dev.gpu, "processes");
    if (!list)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    n = j_len(list);
    if (*infoCount < n || (n && !infos)) {
        *infoCount = n;
        SIM_RETURN(n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    for (const jval *p = list->child; p; p = p->next, i++) {
        long long pid = 0, used = 0;
        sim_number(p, "pid", &pid);
        sim_number(p, "usedGpuMemory", &used);
        infos[i].pid = (unsigned int)pid;
        infos[i].usedGpuMemory = (unsigned long long)used;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *infoCount = n;
    SIM_RETURN(NVML_SUCCESS);
}

/*
 * Per-process utilization samples, from the same "processes" entries: an entry with any of
 * "smUtil", "memUtil", "encUtil", "decUtil", "jpgUtil", "ofaUtil" (percent) has a sample, as a real
 * driver keeps one only for a process that used the GPU. Its timestamp (CPU time in microseconds)
 * is "utilTimestamp" when the entry gives one, else the time of the call: a process that keeps
 * working has a sample newer than any earlier query's. Only samples newer than lastSeenTimeStamp
 * are answered, and none answers NOT_FOUND, as NVML documents. A MIG device, or a GPU in MIG mode,
 * answers NOT_SUPPORTED (nvml.h: process utilization is not supported with MIG); so does a device
 * without "processes".
 */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int sm, mem, enc, dec, jpg, ofa;
} sim_process_sample;

static int sim_process_sample_of(const jval *entry, unsigned long long now_us, sim_process_sample *out)
{
    static const char *const keys[] = {"smUtil", "memUtil", "encUtil", "decUtil", "jpgUtil", "ofaUtil"};
    unsigned int *fields[] = {&out->sm, &out->mem, &out->enc, &out->dec, &out->jpg, &out->ofa};
    long long value, stamp;
    int sampled = 0;

    for (unsigned int k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        *fields[k] = 0;
        if (sim_number(entry, keys[k], &value)) {
            *fields[k] = (unsigned int)value;
            sampled = 1;
        }
    }
    value = 0;
    sim_number(entry, "pid", &value);
    out->pid = (unsigned int)value;
    out->timeStamp = sim_number(entry, "utilTimestamp", &stamp) ? (unsigned long long)stamp : now_us;
    return sampled;
}

/* The samples of `dev` newer than `last_seen` into `out` (up to `room`); their count, or -1 when the
 * device answers NOT_SUPPORTED. */
static int sim_process_samples(const sim_device *dev, unsigned long long last_seen, sim_process_sample *out,
                               unsigned int room)
{
    const jval *list = j_get(dev->gpu, "processes");
    long long mig = 0;
    struct timespec now;
    unsigned long long now_us;
    sim_process_sample sample;
    int n = 0;

    sim_number(j_get(dev->gpu, "migMode"), "current", &mig);
    if (dev->mig || mig || !list)
        return -1;
    clock_gettime(CLOCK_REALTIME, &now);
    now_us = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000ULL;
    for (const jval *p = list->child; p; p = p->next) {
        if (!sim_process_sample_of(p, now_us, &sample) || sample.timeStamp <= last_seen)
            continue;
        if (out && (unsigned int)n < room)
            out[n] = sample;
        n++;
    }
    return n;
}

/* A query that finds no sample costs more than its call's figure on a real card (see sim_real_costs). */
static void sim_no_samples_cost(const char *function)
{
    if (sim_scenario_cost_ns("calls", function) < 0 && sim_model_real())
        sim_spend(SIM_REAL_NO_SAMPLES_NS);
}

/*
 * The samples newer than last_seen that a query may copy: their number, with *count set to it, when the caller
 * gave room for them all; else 0, with the query's answer in *rc (NOT_SUPPORTED, NOT_FOUND, or
 * INSUFFICIENT_SIZE with *count set to the number needed).
 */
static int sim_samples_query(const sim_device *dev, unsigned long long last_seen, unsigned int *count,
                             int room_given, const char *function, sim_process_sample *samples, nvmlReturn_t *rc)
{
    int n = sim_process_samples(dev, last_seen, samples, SIM_MAX_PROCESS_SAMPLES);

    if (n <= 0 || n > SIM_MAX_PROCESS_SAMPLES) {
        if (n == 0)
            sim_no_samples_cost(function);
        *rc = n < 0 ? NVML_ERROR_NOT_SUPPORTED : n == 0 ? NVML_ERROR_NOT_FOUND : NVML_ERROR_UNKNOWN;
        return 0;
    }
    if (!room_given || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        *rc = NVML_ERROR_INSUFFICIENT_SIZE;
        return 0;
    }
    *count = (unsigned int)n;
    return n;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                        unsigned int *processSamplesCount,
                                                        unsigned long long lastSeenTimeStamp)
{
    sim_process_sample samples[SIM_MAX_PROCESS_SAMPLES];
    nvmlReturn_t rc;
    int n;

    SIM_DEVICE_CALL(device, dev);
    if (!processSamplesCount)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    n = sim_samples_query(&dev, lastSeenTimeStamp, processSamplesCount, utilization != NULL, __func__, samples, &rc);
    if (!n)
        SIM_RETURN(rc);
    for (int i = 0; i < n; i++) {
        utilization[i].pid = samples[i].pid;
        utilization[i].timeStamp = samples[i].timeStamp;
        utilization[i].smUtil = samples[i].sm;
        utilization[i].memUtil = samples[i].mem;
        utilization[i].encUtil = samples[i].enc;
        utilization[i].decUtil = samples[i].dec;
    }
    SIM_RETURN(NVML_SUCCESS);
}

/* The versioned form of the same samples, with the JPEG and optical flow engines too. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                              nvmlProcessesUtilizationInfo_t *procesesUtilInfo)
{
    sim_process_sample samples[SIM_MAX_PROCESS_SAMPLES];
    nvmlProcessUtilizationInfo_v1_t *out;
    nvmlReturn_t rc;
    int n;

    SIM_DEVICE_CALL(device, dev);
    if (!procesesUtilInfo)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (procesesUtilInfo->version != nvmlProcessesUtilizationInfo_v1)
        SIM_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    out = procesesUtilInfo->procUtilArray;
    n = sim_samples_query(&dev, procesesUtilInfo->lastSeenTimeStamp, &procesesUtilInfo->processSamplesCount,
                          out != NULL, __func__, samples, &rc);
    if (!n)
        SIM_RETURN(rc);
    for (int i = 0; i < n; i++) {
        out[i].timeStamp = samples[i].timeStamp;
        out[i].pid = samples[i].pid;
        out[i].smUtil = samples[i].sm;
        out[i].memUtil = samples[i].mem;
        out[i].encUtil = samples[i].enc;
        out[i].decUtil = samples[i].dec;
        out[i].jpgUtil = samples[i].jpg;
        out[i].ofaUtil = samples[i].ofa;
    }
    SIM_RETURN(NVML_SUCCESS);
}

/* ---------------------------------------------------------------- events */

/*
 * A device's "xids": [{"xid": 79, "afterMs": 0}, ...] are XID critical error events, due
 * `afterMs` after the scenario was loaded. Each is delivered once to every event set that
 * registered the device for nvmlEventTypeXidCriticalError; reloading the file (a changed
 * scenario) makes them due again, relative to the new load.
 */
#define SIM_MAX_XIDS 16

struct nvmlEventSet_st {
    unsigned long long masks[SIM_MAX_GPUS];
    unsigned long long generation;
    unsigned char delivered[SIM_MAX_GPUS][SIM_MAX_XIDS];
    int watch;    /* sim_watch_scenario()'s descriptor, kept while the set lives; -1 without one */
};

static int sim_watch_scenario(void);

static unsigned long long sim_supported_events(const jval *gpu)
{
    unsigned long long types = nvmlEventTypeXidCriticalError;
    long long enabled = 0;
    if (sim_number(j_get(gpu, "ecc"), "enabled", &enabled) && enabled)
        types |= nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;
    return types;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    SIM_SYSTEM_CALL();
    if (!set)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *set = calloc(1, sizeof(**set));
    if (*set)
        (*set)->watch = sim_watch_scenario();
    SIM_RETURN(*set ? NVML_SUCCESS : NVML_ERROR_MEMORY);
}

SIM_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    pthread_mutex_lock(&sim_lock);
    sim_call(__func__);
    if (set && set->watch >= 0)
        close(set->watch);
    free(set);
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    SIM_DEVICE_CALL(device, dev);
    if (!eventTypes || dev.mig)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = sim_supported_events(dev.gpu);
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    unsigned long long types;

    SIM_DEVICE_CALL(device, dev);
    if (!set || dev.mig)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    types = eventTypes & sim_supported_events(dev.gpu);
    if (!types)
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    set->masks[dev.index] |= types;
    SIM_RETURN(NVML_SUCCESS);
}

/* The first due, undelivered XID for `set`, marked delivered; 0 when none, with *pause_ms lowered to
 * the wait until the next one is due. */
static int sim_next_xid(nvmlEventSet_t set, nvmlEventData_t *data, long long *pause_ms)
{
    struct timespec now;
    long long elapsed_ms;

    if (set->generation != sim_generation) {
        memset(set->delivered, 0, sizeof(set->delivered));
        set->generation = sim_generation;
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    elapsed_ms = (now.tv_sec - sim_loaded_at.tv_sec) * 1000LL + (now.tv_nsec - sim_loaded_at.tv_nsec) / 1000000LL;
    for (unsigned int index = 0; index < sim_device_count; index++) {
        const jval *xids = j_get(sim_devices[index], "xids");
        unsigned int i = 0;
        if (!(set->masks[index] & nvmlEventTypeXidCriticalError))
            continue;
        for (const jval *x = xids && xids->type == J_ARR ? xids->child : NULL; x && i < SIM_MAX_XIDS;
             x = x->next, i++) {
            long long xid, after = 0;
            if (set->delivered[index][i] || !sim_number(x, "xid", &xid))
                continue;
            sim_number(x, "afterMs", &after);
            if (after > elapsed_ms) {
                if (after - elapsed_ms < *pause_ms)
                    *pause_ms = after - elapsed_ms;
                continue;
            }
            set->delivered[index][i] = 1;
            memset(data, 0, sizeof(*data));
            data->device = (nvmlDevice_t)&sim_gpu_handles[index];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = (unsigned long long)xid;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            return 1;
        }
    }
    return 0;
}

/*
 * A watch on the scenario file's folder, so that a waiting caller sleeps as it does in the driver (in
 * the kernel, until an event or the timeout) and still sees a scenario changed meanwhile (new XIDs) at
 * once. -1 where inotify is not available: the caller then looks at the file every 100 ms.
 * An event set keeps its watch from creation to free: setting one up and closing it at every wait
 * cost about 0.2 ms of CPU and several ms of wall time a wait, which a driver's wait does not.
 */
static int sim_watch_scenario(void)
{
    const char *path = sim_config_path();
    char folder[PATH_MAX];
    int fd;

    if (!path || snprintf(folder, sizeof folder, "%s", path) >= (int)sizeof folder)
        return -1;
    fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fd >= 0 && inotify_add_watch(fd, dirname(folder), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE |
                                     IN_ATTRIB) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    struct timespec start, now;
    nvmlReturn_t rc = NVML_ERROR_TIMEOUT;
    int watch;

    pthread_mutex_lock(&sim_lock);
    if (set && set->watch < 0)
        set->watch = sim_watch_scenario();   /* the scenario's folder may have come since */
    watch = set ? set->watch : -1;
    pthread_mutex_unlock(&sim_lock);

    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned int round = 0;; round++) {
        long long waited_ms, pause_ms = watch >= 0 ? (long long)timeoutms : 100;

        pthread_mutex_lock(&sim_lock);
        if (round == 0)
            sim_call(__func__);
        if (!sim_init_refcount)
            rc = NVML_ERROR_UNINITIALIZED;
        else if (!set || !data)
            rc = NVML_ERROR_INVALID_ARGUMENT;
        else {
            sim_refresh();
            rc = sim_next_xid(set, data, &pause_ms) ? NVML_SUCCESS : NVML_ERROR_TIMEOUT;
        }
        pthread_mutex_unlock(&sim_lock);
        if (rc != NVML_ERROR_TIMEOUT)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        waited_ms = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited_ms >= (long long)timeoutms)
            break;
        /* Sleep until the next XID is due, the scenario changes, or the timeout. */
        if (pause_ms > (long long)timeoutms - waited_ms)
            pause_ms = (long long)timeoutms - waited_ms;
        if (watch >= 0) {
            struct pollfd ready = {.fd = watch, .events = POLLIN};
            char events[4096];
            if (poll(&ready, 1, (int)pause_ms + 1) > 0)
                while (read(watch, events, sizeof events) > 0)
                    ;
        } else {
            struct timespec pause = {.tv_sec = pause_ms / 1000, .tv_nsec = (pause_ms % 1000) * 1000000L + 1000000L};
            nanosleep(&pause, NULL);
        }
    }
    return rc;
}

/* ------------------------------------------------------------------- GPM */

/*
 * GPU Performance Monitoring (Hopper and later): a device with "gpm": {"anyTensorUtil": 42} supports
 * it and answers NVML_GPM_METRIC_ANY_TENSOR_UTIL with that percentage between any two samples.
 * With MIG on, nvmlGpmMigSampleGet samples one GPU instance of it: the metrics come from the "gpm" of
 * that instance's entry in "migDevices" (an instance without one reads idle, 0), and a sample of the
 * whole GPU is refused, as each instance is measured on its own.
 */
struct nvmlGpmSample_st {
    unsigned int index;
    int taken;
    int gi;               /* the GPU instance sampled, or -1: the whole GPU */
};

SIM_EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    SIM_DEVICE_CALL(device, dev);
    if (!gpmSupport)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (gpmSupport->version != NVML_GPM_SUPPORT_VERSION)
        SIM_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    gpmSupport->isSupportedDevice = !dev.mig && j_get(dev.gpu, "gpm") != NULL;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    if (!gpmSample)
        return NVML_ERROR_INVALID_ARGUMENT;
    *gpmSample = calloc(1, sizeof(**gpmSample));
    return *gpmSample ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    free(gpmSample);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    SIM_DEVICE_CALL(device, dev);
    if (!gpmSample)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (dev.mig || !j_get(dev.gpu, "gpm") || sim_mig_enabled(dev.gpu))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    gpmSample->index = dev.index;
    gpmSample->taken = 1;
    gpmSample->gi = -1;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample)
{
    SIM_DEVICE_CALL(device, dev);
    if (!gpmSample || dev.mig)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!j_get(dev.gpu, "gpm"))
        SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
    /* the H200 with MIG off answered INVALID_ARGUMENT (real-h200/mig-check.json) */
    if (!sim_mig_enabled(dev.gpu))
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (!sim_gi_entry(dev.gpu, gpuInstanceId))
        SIM_RETURN(NVML_ERROR_NOT_FOUND);
    gpmSample->index = dev.index;
    gpmSample->taken = 1;
    gpmSample->gi = (int)gpuInstanceId;
    SIM_RETURN(NVML_SUCCESS);
}

SIM_EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    const jval *gpm;

    SIM_SYSTEM_CALL();
    if (!metricsGet || !metricsGet->sample1 || !metricsGet->sample2 || metricsGet->numMetrics > NVML_GPM_METRIC_MAX)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (metricsGet->version != NVML_GPM_METRICS_GET_VERSION)
        SIM_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (!metricsGet->sample1->taken || !metricsGet->sample2->taken ||
        metricsGet->sample1->index != metricsGet->sample2->index || metricsGet->sample1->gi != metricsGet->sample2->gi ||
        metricsGet->sample1->index >= sim_device_count)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    gpm = j_get(sim_devices[metricsGet->sample1->index], "gpm");
    if (metricsGet->sample1->gi >= 0) {
        const jval *entry = sim_gi_entry(sim_devices[metricsGet->sample1->index], (unsigned int)metricsGet->sample1->gi);
        gpm = entry ? j_get(entry, "gpm") : NULL;
    }
    for (unsigned int i = 0; i < metricsGet->numMetrics; i++) {
        long long value;
        nvmlGpmMetric_t *metric = &metricsGet->metrics[i];
        const char *key = NULL;
        switch (metric->metricId) {
        case NVML_GPM_METRIC_ANY_TENSOR_UTIL: key = "anyTensorUtil"; break;
        case NVML_GPM_METRIC_GRAPHICS_UTIL: key = "graphicsUtil"; break;
        case NVML_GPM_METRIC_DRAM_BW_UTIL: key = "dramBwUtil"; break;
        case NVML_GPM_METRIC_PCIE_TX_PER_SEC: key = "pcieTxMiBPerSecond"; break;
        case NVML_GPM_METRIC_PCIE_RX_PER_SEC: key = "pcieRxMiBPerSecond"; break;
        default: break;
        }
        if (key && sim_number(gpm, key, &value)) {
            metric->value = (double)value;
            metric->nvmlReturn = NVML_SUCCESS;
        } else if (key && metricsGet->sample1->gi >= 0) {
            metric->value = 0.0;   /* an instance the scenario says nothing of is idle */
            metric->nvmlReturn = NVML_SUCCESS;
        } else {
            metric->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    /* The call's own figure covered one warm metric: see SIM_REAL_GPM_COLD_NS for the rest. */
    if (sim_model_real() && sim_scenario_cost_ns("calls", "nvmlGpmMetricsGet") < 0) {
        long long warm = sim_cost_ns("nvmlGpmMetricsGet");
        if (!sim_gpm_warm)
            sim_spend(SIM_REAL_GPM_COLD_NS - warm);
        else if (metricsGet->numMetrics > 1)
            sim_spend((long long)(metricsGet->numMetrics - 1) * warm);
        sim_gpm_warm = 1;
    }
    SIM_RETURN(NVML_SUCCESS);
}

/* ---------------------------------------- NVIDIA's DRA kubelet plugin
 *
 * The calls NVIDIA's DRA kubelet plugin (kubernetes-sigs/dra-driver-nvidia-gpu) makes that nothing
 * else here needed; tools/dra/make-fixtures runs it on every scenario. */

/* The board's brand as the driver reports it, when the scenario gives no "brand": taken from the
 * product name, as NVIDIA names its boards (nvidia-smi's "Product Brand"). */
static nvmlBrandType_t sim_brand_of_name(const char *name)
{
    static const struct { const char *prefix; nvmlBrandType_t brand; } brands[] = {
        {"Tesla ", NVML_BRAND_TESLA},
        {"TITAN", NVML_BRAND_TITAN},
        {"NVIDIA TITAN", NVML_BRAND_TITAN},
        {"Quadro RTX", NVML_BRAND_QUADRO_RTX},
        {"Quadro", NVML_BRAND_QUADRO},
        {"NVS", NVML_BRAND_NVS},
        {"GeForce", NVML_BRAND_GEFORCE},
        {"NVIDIA GeForce", NVML_BRAND_GEFORCE},
        {"NVIDIA RTX", NVML_BRAND_NVIDIA_RTX},
    };

    for (size_t i = 0; i < sizeof(brands) / sizeof(brands[0]); i++)
        if (strncmp(name, brands[i].prefix, strlen(brands[i].prefix)) == 0)
            return brands[i].brand;
    return NVML_BRAND_NVIDIA;
}

/* Every board has a brand ("For all products"): a MIG device answers its GPU's. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    const jval *name;
    long long brand;

    SIM_DEVICE_CALL(device, dev);
    if (!type)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (sim_number(dev.gpu, "brand", &brand)) {
        *type = (nvmlBrandType_t)brand;
        SIM_RETURN(NVML_SUCCESS);
    }
    name = j_get(dev.gpu, "name");
    *type = sim_brand_of_name(name && name->type == J_STR ? name->str : "");
    SIM_RETURN(NVML_SUCCESS);
}

/* HMM, ATS or none: answered from "addressingMode" (an nvmlDeviceAddressingModeType_t); without it
 * NOT_SUPPORTED, as before Turing, or on a platform without either, or on a driver older than the
 * call (before R570) where a caller that looks the symbol up first finds nothing to ask. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device, nvmlDeviceAddressingMode_t *mode)
{
    SIM_DEVICE_CALL(device, dev);
    if (!mode)
        SIM_RETURN(NVML_ERROR_INVALID_ARGUMENT);
    if (mode->version != nvmlDeviceAddressingMode_v1)
        SIM_RETURN(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    SIM_NUMBER_OR_UNSUPPORTED(dev.gpu, "addressingMode", value);
    mode->value = (unsigned int)value;
    SIM_RETURN(NVML_SUCCESS);
}

/* ------------------------------------------------------ simulator only */

/* Every NVML entry point NVIDIA's tools link against that the simulator does not model answers here
 * (tools/build-simulator makes one function per name, listed in tests/fixtures/nvml-symbols): the call
 * is counted and costs what any other call does, and answers as a driver does for a feature the GPU
 * lacks. Not exported: only the generated functions call it. */
int sim_unsimulated(const char *function)
{
    pthread_mutex_lock(&sim_lock);
    sim_call(function);
    if (!sim_init_refcount)
        SIM_RETURN(NVML_ERROR_UNINITIALIZED);
    SIM_RETURN(NVML_ERROR_NOT_SUPPORTED);
}

SIM_EXPORT unsigned long long nvmlsimCallCount(void)
{
    unsigned long long calls;
    pthread_mutex_lock(&sim_lock);
    calls = sim_calls;
    pthread_mutex_unlock(&sim_lock);
    return calls;
}

SIM_EXPORT void nvmlsimResetCallCount(void)
{
    pthread_mutex_lock(&sim_lock);
    sim_calls = 0;
    sim_spent_ns = 0;
    memset(sim_counted, 0, sizeof(sim_counted));
    pthread_mutex_unlock(&sim_lock);
}

/* Calls of one NVML function (by its C name) since the last reset. */
SIM_EXPORT unsigned long long nvmlsimCallCountOf(const char *function)
{
    unsigned long long calls = 0;
    pthread_mutex_lock(&sim_lock);
    for (int i = 0; i < SIM_MAX_COUNTED && sim_counted[i].name; i++)
        if (strcmp(sim_counted[i].name, function) == 0)
            calls = sim_counted[i].calls;
    pthread_mutex_unlock(&sim_lock);
    return calls;
}

/* Nanoseconds the cost model spent since the last reset. */
SIM_EXPORT unsigned long long nvmlsimSpentNs(void)
{
    unsigned long long spent;
    pthread_mutex_lock(&sim_lock);
    spent = sim_spent_ns;
    pthread_mutex_unlock(&sim_lock);
    return spent;
}
