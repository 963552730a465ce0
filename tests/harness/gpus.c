/* What a container can reach of the GPUs, one line each, for the container tests:
 *   dev <name>          each NVIDIA device node under /dev (nvidia0.., nvidiactl, nvidia-uvm, nvidia-caps/..)
 *   nvml <index> <uuid>  each GPU NVML lists, and each MIG device under it as "nvml <index>:<mig> <uuid>"
 *   nvml-error <text>    when libnvidia-ml.so.1 cannot be loaded or initialised
 * and then waits for a signal when given --wait (a pod's container that must keep running).
 * Given --require N it exits 0 when it found exactly N GPU device nodes (nvidia0..) and NVML listed exactly
 * N GPUs, 1 otherwise: the workload (N = 1) and the isolation probe (N = 0) of the validation playbook. */
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*init_fn)(void);
typedef int (*count_fn)(unsigned int *);
typedef int (*handle_fn)(unsigned int, void **);
typedef int (*uuid_fn)(void *, char *, unsigned int);
typedef int (*max_mig_fn)(void *, unsigned int *);
typedef int (*mig_handle_fn)(void *, unsigned int, void **);

static int gpu_nodes;

static void list_dev(const char *folder, const char *prefix)
{
    DIR *dir = opendir(folder);
    struct dirent *entry;
    if (!dir)
        return;
    while ((entry = readdir(dir)))
        if (strncmp(entry->d_name, "nvidia", 6) == 0) {
            printf("dev %s%s\n", prefix, entry->d_name);
            if (!*prefix && entry->d_name[6] >= '0' && entry->d_name[6] <= '9')
                gpu_nodes++;
            if (strcmp(entry->d_name, "nvidia-caps") == 0)
                list_dev("/dev/nvidia-caps", "nvidia-caps/");
        }
    closedir(dir);
}

static void leave(int sig) { (void)sig; _exit(0); }

int main(int argc, char **argv)
{
    unsigned int gpus = 0;
    list_dev("/dev", "");
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        printf("nvml-error %s\n", dlerror());
    } else {
        init_fn init = (init_fn)dlsym(nvml, "nvmlInit_v2");
        count_fn count = (count_fn)dlsym(nvml, "nvmlDeviceGetCount_v2");
        handle_fn handle = (handle_fn)dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
        uuid_fn uuid = (uuid_fn)dlsym(nvml, "nvmlDeviceGetUUID");
        max_mig_fn max_mig = (max_mig_fn)dlsym(nvml, "nvmlDeviceGetMaxMigDeviceCount");
        mig_handle_fn mig_handle = (mig_handle_fn)dlsym(nvml, "nvmlDeviceGetMigDeviceHandleByIndex");
        int status;
        if (!init || !count || !handle || !uuid)
            printf("nvml-error the library lacks the NVML calls\n");
        else if ((status = init()) != 0)
            printf("nvml-error nvmlInit returned %d\n", status);
        else if ((status = count(&gpus)) != 0)
            printf("nvml-error nvmlDeviceGetCount returned %d\n", status);
        for (unsigned int i = 0; i < gpus; i++) {
            void *device;
            char text[96];
            unsigned int migs = 0;
            if (handle(i, &device) != 0 || uuid(device, text, sizeof text) != 0)
                continue;
            printf("nvml %u %s\n", i, text);
            if (max_mig && mig_handle && max_mig(device, &migs) == 0)
                for (unsigned int m = 0; m < migs; m++) {
                    void *mig;
                    if (mig_handle(device, m, &mig) == 0 && uuid(mig, text, sizeof text) == 0)
                        printf("nvml %u:%u %s\n", i, m, text);
                }
        }
    }
    fflush(stdout);
    if (argc > 2 && strcmp(argv[1], "--require") == 0) {
        unsigned int wanted = (unsigned int)atoi(argv[2]);
        int met = gpus == wanted && gpu_nodes == (int)wanted;
        printf("%s: %d GPU device nodes, %u GPUs from NVML, %u required\n", met ? "pass" : "fail", gpu_nodes, gpus,
               wanted);
        return met ? 0 : 1;
    }
    if (argc > 1 && strcmp(argv[1], "--wait") == 0) {
        signal(SIGTERM, leave);
        signal(SIGINT, leave);
        for (;;)
            pause();
    }
    return 0;
}
