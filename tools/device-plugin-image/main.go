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
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const deviceList = "/var/run/nvidia-container-devices"

type plugin struct {
	api.UnimplementedDevicePluginServer
	uuids    []string
	strategy string
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, stream api.DevicePlugin_ListAndWatchServer) error {
	devices := make([]*api.Device, 0, len(p.uuids))
	for _, uuid := range p.uuids {
		devices = append(devices, &api.Device{ID: uuid, Health: api.Healthy})
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
		given := &api.ContainerAllocateResponse{Envs: map[string]string{}}
		switch p.strategy {
		case "envvar":
			given.Envs["NVIDIA_VISIBLE_DEVICES"] = strings.Join(container.DevicesIds, ",")
		case "volume-mounts":
			given.Envs["NVIDIA_VISIBLE_DEVICES"] = deviceList
			for _, id := range container.DevicesIds {
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

// serve serves `uuids` as `resource` on a socket of its own and registers it with the kubelet.
func serve(resource string, uuids []string, strategy string) error {
	endpoint := "scv-test-" + strings.NewReplacer("/", "-", ".", "-").Replace(resource) + ".sock"
	socket := filepath.Join(api.DevicePluginPath, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, &plugin{uuids: uuids, strategy: strategy})
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

func main() {
	strategy := os.Getenv("DEVICE_LIST_STRATEGY")
	if strategy == "" {
		strategy = "envvar"
	}
	if strategy != "envvar" && strategy != "volume-mounts" {
		fmt.Fprintf(os.Stderr, "DEVICE_LIST_STRATEGY %q: this plugin serves envvar and volume-mounts\n", strategy)
		os.Exit(2)
	}
	mig := os.Getenv("MIG_STRATEGY")
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
	for _, resource := range resources {
		if err := serve(resource, found[resource], strategy); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("registered %s\n", resource)
	}
	select {}
}
