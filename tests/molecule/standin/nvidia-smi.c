/* Stand-in nvidia-smi for scv.gpu's molecule tests; not NVIDIA's program.
 *
 * Answers through whatever libnvidia-ml.so.1 the loader finds (the stand-in driver packages
 * ship the NVML simulator), so "nvidia-smi answers" means what it means on a real host: the
 * library loads and the driver answers. Supports the one query the nvidia_driver role makes,
 *   nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
 * and otherwise prints one line per GPU. Exits 9 when NVML cannot reach the driver, as
 * nvidia-smi does.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*init_fn)(void);
typedef int (*count_fn)(unsigned int *);
typedef int (*handle_fn)(unsigned int, void **);
typedef int (*name_fn)(void *, char *, unsigned int);
typedef int (*version_fn)(char *, unsigned int);

int main(int argc, char **argv)
{
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        fprintf(stderr, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.\n");
        return 12;
    }
    init_fn init = (init_fn)dlsym(nvml, "nvmlInit_v2");
    count_fn count = (count_fn)dlsym(nvml, "nvmlDeviceGetCount_v2");
    handle_fn handle = (handle_fn)dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
    name_fn name = (name_fn)dlsym(nvml, "nvmlDeviceGetName");
    version_fn driver = (version_fn)dlsym(nvml, "nvmlSystemGetDriverVersion");
    if (!init || !count || !handle || !name || !driver || init() != 0) {
        fprintf(stderr, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n");
        return 9;
    }
    int csv = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--query-gpu=index,name,driver_version") == 0)
            csv = 1;
        else if (strcmp(argv[i], "--format=csv,noheader") != 0) {
            fprintf(stderr, "stand-in nvidia-smi: unsupported argument %s\n", argv[i]);
            return 2;
        }
    }
    char version[96] = "";
    unsigned int gpus = 0;
    driver(version, sizeof version);
    count(&gpus);
    for (unsigned int i = 0; i < gpus; i++) {
        void *device = NULL;
        char model[96] = "";
        if (handle(i, &device) == 0)
            name(device, model, sizeof model);
        if (csv)
            printf("%u, %s, %s\n", i, model, version);
        else
            printf("GPU %u: %s (driver %s, stand-in nvidia-smi)\n", i, model, version);
    }
    return 0;
}
