// nri-device-injector: the benchmark's Go baseline (bench/nri_latency.py). It does the job of the
// upstream containerd/nri "device-injector" sample on the same upstream stub library: for a pod
// annotation "devices.nri.io/container.<name>" holding a JSON list of devices
// ({"path","type","major","minor","file_mode"}), it adds those devices at CreateContainer.
// The upstream sample lives in its own module that the Go proxy does not serve, so this file is
// written for gpushare (not copied) and built by hack/containerd/install.sh next to containerd 2.x.
// Each call logs "took_us=N" on stderr so the benchmark can read its handler latency.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type device struct {
	Path     string `json:"path"`
	Type     string `json:"type"`
	Major    int64  `json:"major"`
	Minor    int64  `json:"minor"`
	FileMode uint32 `json:"file_mode"`
}

type plugin struct{}

func (plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	adjust := &api.ContainerAdjustment{}
	value, ok := pod.GetAnnotations()["devices.nri.io/container."+ctr.GetName()]
	if ok {
		var devices []device
		if err := json.Unmarshal([]byte(value), &devices); err != nil {
			return nil, nil, fmt.Errorf("invalid device annotation for %q: %w", ctr.GetName(), err)
		}
		for _, d := range devices {
			ld := &api.LinuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor}
			if d.FileMode != 0 {
				ld.FileMode = &api.OptionalFileMode{Value: d.FileMode}
			}
			adjust.AddDevice(ld)
		}
	}
	fmt.Fprintf(os.Stderr, "create container=%s devices=%d took_us=%d\n",
		ctr.GetName(), len(adjust.GetLinux().GetDevices()), time.Since(start).Microseconds())
	return adjust, nil, nil
}

func main() {
	socket := flag.String("socket", "/var/run/nri/nri.sock", "NRI socket of the runtime")
	name := flag.String("name", "device-injector", "plugin name")
	idx := flag.String("idx", "20", "plugin index")
	flag.Parse()
	s, err := stub.New(plugin{}, stub.WithSocketPath(*socket), stub.WithPluginName(*name), stub.WithPluginIdx(*idx))
	if err != nil {
		fmt.Fprintf(os.Stderr, "nri-device-injector: %v\n", err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "nri-device-injector: %v\n", err)
		os.Exit(1)
	}
}
