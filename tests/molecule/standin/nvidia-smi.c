/* Stand-in nvidia-smi for scv.gpu's molecule tests; not NVIDIA's program.
 *
 * Answers through whatever libnvidia-ml.so.1 the loader finds (the stand-in driver packages
 * ship the NVML simulator), so "nvidia-smi answers" means what it means on a real host: the
 * library loads and the driver answers. Supports the one query the nvidia_driver role makes,
 *   nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
 * and -L (the GPUs and their MIG devices, with UUIDs, which scv-gpu-cdi-refresh reads);
 * otherwise prints one line per GPU. Exits 9 when NVML cannot reach the driver, as
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
typedef int (*uuid_fn)(void *, char *, unsigned int);
typedef int (*uint_fn)(void *, unsigned int *);
typedef int (*mig_handle_fn)(void *, unsigned int, void **);

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
    uuid_fn uuid = (uuid_fn)dlsym(nvml, "nvmlDeviceGetUUID");
    uint_fn max_mig = (uint_fn)dlsym(nvml, "nvmlDeviceGetMaxMigDeviceCount");
    mig_handle_fn mig_handle = (mig_handle_fn)dlsym(nvml, "nvmlDeviceGetMigDeviceHandleByIndex");
    int csv = 0, list = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--query-gpu=index,name,driver_version") == 0)
            csv = 1;
        else if (strcmp(argv[i], "-L") == 0)
            list = 1;
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
        else if (list) {
            /* as nvidia-smi -L: each GPU with its UUID, then its MIG devices with theirs */
            char id[96] = "";
            unsigned int slots = 0;
            if (uuid && device)
                uuid(device, id, sizeof id);
            printf("GPU %u: %s (UUID: %s)\n", i, model, id);
            if (max_mig && mig_handle && device && max_mig(device, &slots) == 0) {
                for (unsigned int m = 0; m < slots; m++) {
                    void *mig = NULL;
                    char mig_name[96] = "", mig_id[96] = "";
                    if (mig_handle(device, m, &mig) != 0 || !mig)
                        continue;
                    name(mig, mig_name, sizeof mig_name);
                    if (uuid)
                        uuid(mig, mig_id, sizeof mig_id);
                    printf("  MIG %s Device %u: (UUID: %s)\n", mig_name, m, mig_id);
                }
            }
        } else
            printf("GPU %u: %s (driver %s, stand-in nvidia-smi)\n", i, model, version);
    }
    return 0;
}
