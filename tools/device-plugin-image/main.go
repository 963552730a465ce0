// The container tests' device plugin: the program of the image that replaces NVIDIA's in the device
// plugin DaemonSet the device_plugin role renders. It does, from inside its container, what that
// DaemonSet's container must be able to do: load NVML (the driver's libnvidia-ml.so.1, which NVIDIA's
// runtime mounts), list the GPUs it was given, and serve them to the kubelet as nvidia.com/gpu under
// the device list strategy in DEVICE_LIST_STRATEGY, the way NVIDIA's plugin hands them out:
//   - envvar: NVIDIA_VISIBLE_DEVICES=<UUID,...>;
//   - volume-mounts: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices, and for each GPU a
//     mount of /dev/null at /var/run/nvidia-container-devices/<UUID>.
// Device IDs are the GPUs' UUIDs. Without NVML it exits 1, as NVIDIA's plugin does by default
// (fail-on-init-error). It prints "nvml <UUID>" for each GPU it found, then "registered".
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	resource   = "nvidia.com/gpu"
	endpoint   = "scv-test-nvidia-gpu.sock"
	deviceList = "/var/run/nvidia-container-devices"
)

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

func gpus() ([]string, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("failed to initialize NVML: %v", nvml.ErrorString(ret))
	}
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetCount: %v", nvml.ErrorString(ret))
	}
	var uuids []string
	for index := 0; index < count; index++ {
		device, ret := nvml.DeviceGetHandleByIndex(index)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %v", index, nvml.ErrorString(ret))
		}
		uuid, ret := device.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetUUID(%d): %v", index, nvml.ErrorString(ret))
		}
		uuids = append(uuids, uuid)
	}
	return uuids, nil
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
	uuids, err := gpus()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, uuid := range uuids {
		fmt.Printf("nvml %s\n", uuid)
	}
	socket := filepath.Join(api.DevicePluginPath, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, &plugin{uuids: uuids, strategy: strategy})
	go func() { _ = server.Serve(listener) }()

	connection, err := grpc.NewClient("unix://"+api.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(connection).Register(ctx, &api.RegisterRequest{
		Version: api.Version, Endpoint: endpoint, ResourceName: resource})
	if err != nil {
		fmt.Fprintf(os.Stderr, "registering with the kubelet: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("registered")
	select {}
}
