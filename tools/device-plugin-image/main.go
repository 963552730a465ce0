// The container tests' device plugin: the program of the image that replaces NVIDIA's in the device
// plugin DaemonSet the device_plugin role renders. It does, from inside its container, what that
// DaemonSet's container must be able to do: load NVML (the driver's libnvidia-ml.so.1, which NVIDIA's
// runtime mounts), list the GPUs it was given, and serve them to the kubelet as nvidia.com/gpu under
// the device list strategy in DEVICE_LIST_STRATEGY, the way NVIDIA's plugin hands them out:
//   - envvar: NVIDIA_VISIBLE_DEVICES=<UUID,...>;
//   - volume-mounts: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices, and for each GPU a
//     mount of /dev/null at /var/run/nvidia-container-devices/<UUID>.
//
// Device IDs are the GPUs' UUIDs. Under MIG_STRATEGY=mixed a GPU with MIG on offers its MIG
// devices instead, by their UUIDs, as nvidia.com/mig-<profile> (the profile from the MIG device's
// name, "... MIG 1g.10gb"), one resource, socket and registration each, as NVIDIA's plugin does.
// Without NVML it exits 1, as NVIDIA's plugin does by default (fail-on-init-error). It prints
// "nvml <UUID>" for each device it found, then "registered <resource>" for each resource.
//
// Time-slicing comes from NVIDIA's config file, at CONFIG_FILE (or --config-file): a resource that
// sharing.timeSlicing gives N > 1 replicas offers N devices per device, <UUID>::0 to <UUID>::N-1 as
// NVIDIA's plugin names them, as <resource>.shared under renameByDefault, and is registered as
// "registered <resource> (<count> devices, <N> replicas each)". A container given replicas gets the
// GPUs they stand for, each once. flags.migStrategy counts where MIG_STRATEGY is unset.
//
// Run as config-manager (the rendered DaemonSet runs NVIDIA's config manager from the plugin's image
// when the role has device_plugin_configs), it stands in for it: see manageConfig.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const deviceList = "/var/run/nvidia-container-devices"

// config is what this plugin reads of NVIDIA's config file (version v1).
type config struct {
	Flags struct {
		MigStrategy string `yaml:"migStrategy"`
	} `yaml:"flags"`
	Sharing struct {
		TimeSlicing struct {
			RenameByDefault            bool `yaml:"renameByDefault"`
			FailRequestsGreaterThanOne bool `yaml:"failRequestsGreaterThanOne"`
			Resources                  []struct {
				Name     string `yaml:"name"`
				Replicas int    `yaml:"replicas"`
			} `yaml:"resources"`
		} `yaml:"timeSlicing"`
		MPS any `yaml:"mps"`
	} `yaml:"sharing"`
}

// readConfig reads the config file at `path`; none at all (no path) is the empty config.
func readConfig(path string) (config, error) {
	var read config
	if path == "" {
		return read, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return read, fmt.Errorf("reading the config file: %v", err)
	}
	if err := yaml.Unmarshal(data, &read); err != nil {
		return read, fmt.Errorf("config file %s: %v", path, err)
	}
	if read.Sharing.MPS != nil {
		return read, fmt.Errorf("config file %s: sharing.mps: this plugin serves time-slicing only", path)
	}
	return read, nil
}

// replicas returns {resource: replicas} of the resources the config time-slices (more than one
// replica); a name without the nvidia.com/ prefix gets it, and the first entry of a name counts.
func (c config) replicas() map[string]int {
	shared := map[string]int{}
	for _, resource := range c.Sharing.TimeSlicing.Resources {
		name := resource.Name
		if !strings.HasPrefix(name, "nvidia.com/") {
			name = "nvidia.com/" + name
		}
		if _, seen := shared[name]; !seen {
			shared[name] = resource.Replicas
		}
	}
	for name, replicas := range shared {
		if replicas < 2 {
			delete(shared, name)
		}
	}
	return shared
}

type plugin struct {
	api.UnimplementedDevicePluginServer
	ids      []string // the devices offered: UUIDs, or <UUID>::<replica>
	replicas int      // 1, or the replicas of each GPU
	failMany bool     // refuse a container more than one replica (failRequestsGreaterThanOne)
	strategy string
}

// uuids returns the UUIDs of the devices `ids` stand for, each once, in order.
func uuids(ids []string) []string {
	found := make([]string, 0, len(ids))
	seen := map[string]bool{}
	for _, id := range ids {
		uuid, _, _ := strings.Cut(id, "::")
		if !seen[uuid] {
			seen[uuid] = true
			found = append(found, uuid)
		}
	}
	return found
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, stream api.DevicePlugin_ListAndWatchServer) error {
	devices := make([]*api.Device, 0, len(p.ids))
	for _, id := range p.ids {
		devices = append(devices, &api.Device{ID: id, Health: api.Healthy})
	}
	if err := stream.Send(&api.ListAndWatchResponse{Devices: devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, request *api.AllocateRequest) (*api.AllocateResponse, error) {
	response := &api.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		if p.failMany && p.replicas > 1 && len(container.DevicesIds) > 1 {
			return nil, fmt.Errorf("a container asks for %d shared GPUs; failRequestsGreaterThanOne allows one",
				len(container.DevicesIds))
		}
		gpus := uuids(container.DevicesIds)
		given := &api.ContainerAllocateResponse{Envs: map[string]string{}}
		switch p.strategy {
		case "envvar":
			given.Envs["NVIDIA_VISIBLE_DEVICES"] = strings.Join(gpus, ",")
		case "volume-mounts":
			given.Envs["NVIDIA_VISIBLE_DEVICES"] = deviceList
			for _, id := range gpus {
				given.Mounts = append(given.Mounts, &api.Mount{HostPath: "/dev/null",
					ContainerPath: filepath.Join(deviceList, id)})
			}
		}
		fmt.Printf("allocate %s\n", strings.Join(container.DevicesIds, ","))
		response.ContainerResponses = append(response.ContainerResponses, given)
	}
	return response, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *api.PreferredAllocationRequest) (*api.PreferredAllocationResponse, error) {
	return &api.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

// devices returns {resource: [UUID]} of the devices NVML lists, under MIG strategy `mig`.
func devices(mig string) (map[string][]string, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("failed to initialize NVML: %v", nvml.ErrorString(ret))
	}
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetCount: %v", nvml.ErrorString(ret))
	}
	found := map[string][]string{}
	for index := 0; index < count; index++ {
		device, ret := nvml.DeviceGetHandleByIndex(index)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %v", index, nvml.ErrorString(ret))
		}
		uuid, ret := device.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetUUID(%d): %v", index, nvml.ErrorString(ret))
		}
		current, _, ret := device.GetMigMode()
		if mig != "mixed" || ret != nvml.SUCCESS || current != nvml.DEVICE_MIG_ENABLE {
			found["nvidia.com/gpu"] = append(found["nvidia.com/gpu"], uuid)
			continue
		}
		slots, ret := device.GetMaxMigDeviceCount()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetMaxMigDeviceCount(%d): %v", index, nvml.ErrorString(ret))
		}
		for slot := 0; slot < slots; slot++ {
			migDevice, ret := device.GetMigDeviceHandleByIndex(slot)
			if ret == nvml.ERROR_NOT_FOUND {
				continue
			}
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("nvmlDeviceGetMigDeviceHandleByIndex(%d, %d): %v", index, slot, nvml.ErrorString(ret))
			}
			migUUID, ret := migDevice.GetUUID()
			name, ret2 := migDevice.GetName()
			if ret != nvml.SUCCESS || ret2 != nvml.SUCCESS {
				return nil, fmt.Errorf("MIG device %d of GPU %d: no UUID or name", slot, index)
			}
			profile := name[strings.LastIndex(name, " ")+1:]
			found["nvidia.com/mig-"+profile] = append(found["nvidia.com/mig-"+profile], migUUID)
		}
	}
	return found, nil
}

// serve serves `served` as `resource` on a socket of its own and registers it with the kubelet.
func serve(resource string, served *plugin) error {
	endpoint := "scv-test-" + strings.NewReplacer("/", "-", ".", "-").Replace(resource) + ".sock"
	socket := filepath.Join(api.DevicePluginPath, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, served)
	go func() { _ = server.Serve(listener) }()

	connection, err := grpc.NewClient("unix://"+api.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(connection).Register(ctx, &api.RegisterRequest{
		Version: api.Version, Endpoint: endpoint, ResourceName: resource})
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet: %v", resource, err)
	}
	return nil
}

// manageConfig stands in for NVIDIA's config manager: it links CONFIG_FILE_SRCDIR/DEFAULT_CONFIG (the
// ConfigMap's key) to CONFIG_FILE_DST, where the plugin's CONFIG_FILE points, then returns (ONESHOT=true,
// the init container) or waits (the sidecar). NVIDIA's reads the node's nvidia.com/device-plugin.config
// label through the API server, which the tests' pods cannot reach (their network is isolated), so every
// node gets DEFAULT_CONFIG here, and a changed label is not followed.
func manageConfig() error {
	chosen := os.Getenv("DEFAULT_CONFIG")
	if chosen == "" {
		return errors.New("config-manager: DEFAULT_CONFIG is empty; this stand-in follows no node label, so it needs one")
	}
	source := filepath.Join(os.Getenv("CONFIG_FILE_SRCDIR"), chosen)
	if _, err := os.Stat(source); err != nil {
		return fmt.Errorf("config-manager: config %q: %v", chosen, err)
	}
	destination := os.Getenv("CONFIG_FILE_DST")
	staging := destination + ".new"
	_ = os.Remove(staging)
	if err := os.Symlink(source, staging); err != nil {
		return fmt.Errorf("config-manager: %v", err)
	}
	if err := os.Rename(staging, destination); err != nil {
		return fmt.Errorf("config-manager: %v", err)
	}
	fmt.Printf("config %s\n", chosen)
	if os.Getenv("ONESHOT") != "true" {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
		<-stop
	}
	return nil
}

// configPath returns the value of --config-file among `args`, else CONFIG_FILE. NVIDIA's plugin takes more
// arguments (device_plugin_extra_args), which this one ignores.
func configPath(args []string) string {
	for index, arg := range args {
		if value, found := strings.CutPrefix(arg, "--config-file="); found {
			return value
		}
		if arg == "--config-file" && index+1 < len(args) {
			return args[index+1]
		}
	}
	return os.Getenv("CONFIG_FILE")
}

func main() {
	if filepath.Base(os.Args[0]) == "config-manager" {
		if err := manageConfig(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	read, err := readConfig(configPath(os.Args[1:]))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	strategy := os.Getenv("DEVICE_LIST_STRATEGY")
	if strategy == "" {
		strategy = "envvar"
	}
	if strategy != "envvar" && strategy != "volume-mounts" {
		fmt.Fprintf(os.Stderr, "DEVICE_LIST_STRATEGY %q: this plugin serves envvar and volume-mounts\n", strategy)
		os.Exit(2)
	}
	mig := os.Getenv("MIG_STRATEGY")
	if mig == "" {
		mig = read.Flags.MigStrategy
	}
	if mig != "" && mig != "none" && mig != "mixed" {
		fmt.Fprintf(os.Stderr, "MIG_STRATEGY %q: this plugin serves none and mixed\n", mig)
		os.Exit(2)
	}
	found, err := devices(mig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	resources := make([]string, 0, len(found))
	for resource := range found {
		resources = append(resources, resource)
	}
	sort.Strings(resources)
	for _, resource := range resources {
		for _, uuid := range found[resource] {
			fmt.Printf("nvml %s\n", uuid)
		}
	}
	shared := read.replicas()
	slicing := read.Sharing.TimeSlicing
	for _, resource := range resources {
		served := &plugin{ids: found[resource], replicas: 1, failMany: slicing.FailRequestsGreaterThanOne,
			strategy: strategy}
		name, note := resource, ""
		if replicas := shared[resource]; replicas > 1 {
			served.ids, served.replicas = nil, replicas
			for _, uuid := range found[resource] {
				for replica := 0; replica < replicas; replica++ {
					served.ids = append(served.ids, fmt.Sprintf("%s::%d", uuid, replica))
				}
			}
			if slicing.RenameByDefault {
				name = resource + ".shared"
			}
			note = fmt.Sprintf(" (%d devices, %d replicas each)", len(served.ids), replicas)
		}
		if err := serve(name, served); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("registered %s%s\n", name, note)
	}
	select {}
}
