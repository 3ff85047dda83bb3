// Command dradriver is the DRA driver of dra-guard's end-to-end tests: a real kubelet plugin built
// on k8s.io/dynamic-resource-allocation/kubeletplugin, shaped like the public drivers
// (dra-example-driver, NVIDIA's GPU driver) but with no hardware behind it.
//
// It registers with the kubelet under --plugin-dir and the kubelet's plugins_registry, publishes
// one ResourceSlice (pool = node name) with --devices devices named dev-0..dev-N-1, prepares each
// claim by writing a CDI spec file <cdi-dir>/<driver>-<claim UID>.json (an env edit
// DRA_GUARD_TEST_DEVICE=<device>) and unprepares it by removing that file. Every prepare and
// unprepare is logged on stdout as one line:
//
//	dradriver: prepared claim <namespace>/<name> uid=<uid> devices=<d1,d2> cdi=<file>
//	dradriver: unprepared claim <namespace>/<name> uid=<uid> cdi=<file> removed=<true|false>
//
// It serves the gRPC health service (grpc.health.v1) on --healthcheck-address:--healthcheck-port
// for the service names "" and "liveness", as the NVIDIA driver does on --healthcheck-port, so
// dra-guard's probes policy finds the port and the kubelet's gRPC probes reach it.
//
// Fault switches for the tests:
//   - --start-delay=D: sleep D before anything (health port closed meanwhile: a slow start);
//   - --unhealthy-file=PATH: while PATH exists, health answers NOT_SERVING (checked every 0.5 s);
//   - --unprepare-fail-file=PATH: while PATH exists, every unprepare fails (the kubelet keeps the
//     consumer Terminating and retries), logged as
//     "dradriver: unprepare of claim <namespace>/<name> uid=<uid> failed: <PATH> exists";
//   - --unprepare-delay-file=PATH: when PATH holds a Go duration ("3s"), each unprepare call sleeps
//     that long first (read at each call, so a test changes it without restarting the driver).
//
// With --pod-uid (the downward API's metadata.uid) it uses the kubelet's rolling-update
// registration, so two instances can serve during a surge rollout of its DaemonSet.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

type driver struct {
	name   string
	cdiDir string
	// failFile, delayFile: the fault switches --unprepare-fail-file and --unprepare-delay-file ("": off)
	failFile  string
	delayFile string
}

// unprepareDelay is the duration written in delayFile (0 when it is absent, empty or unreadable).
func (d *driver) unprepareDelay() time.Duration {
	if d.delayFile == "" {
		return 0
	}
	raw, err := os.ReadFile(d.delayFile)
	if err != nil {
		return 0
	}
	delay, err := time.ParseDuration(strings.TrimSpace(string(raw)))
	if err != nil {
		log.Printf("dradriver: ignoring %s: %v", d.delayFile, err)
		return 0
	}
	return delay
}

func (d *driver) cdiFile(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-%s.json", d.name, uid))
}

// PrepareResourceClaims writes one CDI spec per claim and returns its CDI device IDs.
func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var devices []kubeletplugin.Device
		var cdiDevices []map[string]any
		var names []string
		if claim.Status.Allocation != nil {
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Driver != d.name {
					continue
				}
				cdiName := fmt.Sprintf("%s-%s", claim.UID, r.Device)
				devices = append(devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool,
					DeviceName: r.Device, CDIDeviceIDs: []string{d.name + "/device=" + cdiName}})
				cdiDevices = append(cdiDevices, map[string]any{"name": cdiName, "containerEdits": map[string]any{
					"env": []string{"DRA_GUARD_TEST_DEVICE=" + r.Device}}})
				names = append(names, r.Device)
			}
		}
		spec, _ := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": d.name + "/device", "devices": cdiDevices})
		file := d.cdiFile(claim.UID)
		if err := os.WriteFile(file+".tmp", spec, 0o644); err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		log.Printf("dradriver: prepared claim %s/%s uid=%s devices=%s cdi=%s", claim.Namespace, claim.Name, claim.UID,
			strings.Join(names, ","), file)
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

// UnprepareResourceClaims removes the claims' CDI spec files (idempotent), after the delay of
// --unprepare-delay-file; while --unprepare-fail-file exists it fails each claim instead.
func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	if delay := d.unprepareDelay(); delay > 0 {
		// a plain sleep: on SIGTERM main returns and the process exits while the call still sleeps,
		// so a driver stopped mid-unprepare never logs that claim's "unprepared claim" line before
		// its "stopping" (how the tests see a driver evicted too early)
		log.Printf("dradriver: unprepare of %d claim(s) sleeping %s", len(claims), delay)
		time.Sleep(delay)
	}
	for _, claim := range claims {
		if d.failFile != "" {
			if _, err := os.Stat(d.failFile); err == nil {
				log.Printf("dradriver: unprepare of claim %s/%s uid=%s failed: %s exists", claim.Namespace, claim.Name,
					claim.UID, d.failFile)
				out[claim.UID] = fmt.Errorf("unprepare fails while %s exists", d.failFile)
				continue
			}
		}
		file := d.cdiFile(claim.UID)
		err := os.Remove(file)
		removed := err == nil
		if os.IsNotExist(err) {
			err = nil
		}
		log.Printf("dradriver: unprepared claim %s/%s uid=%s cdi=%s removed=%t", claim.Namespace, claim.Name, claim.UID,
			file, removed)
		out[claim.UID] = err
	}
	return out, nil
}

// HandleError logs background errors (ResourceSlice publishing); they are retried by the helper.
func (d *driver) HandleError(_ context.Context, err error, msg string) {
	log.Printf("dradriver: error: %s: %v", msg, err)
}

// WatchHealthStatus: no per-device health reporting (the helper's HealthService is off).
func (d *driver) WatchHealthStatus(ctx context.Context, _ chan<- kubeletplugin.DeviceHealthReport) error {
	<-ctx.Done()
	return nil
}

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetOutput(os.Stdout)
	name := flag.String("driver-name", "gpu.e2e.dra-guard.test", "DRA driver name")
	nodeName := flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (hostNetwork pods have no in-cluster Service here)")
	pluginDir := flag.String("plugin-dir", "", "plugin data folder (default /var/lib/kubelet/plugins/<driver-name>)")
	registryDir := flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugins_registry folder")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where CDI spec files are written")
	devices := flag.Int("devices", 2, "number of devices published")
	healthAddr := flag.String("healthcheck-address", os.Getenv("POD_IP"), "address of the gRPC health service (default $POD_IP)")
	healthPort := flag.Int("healthcheck-port", 51515, "port of the gRPC health service (services \"\" and \"liveness\"); <=0 disables it")
	startDelay := flag.Duration("start-delay", 0, "sleep this long before starting (a slow driver)")
	unhealthyFile := flag.String("unhealthy-file", "", "while this file exists, health answers NOT_SERVING")
	failFile := flag.String("unprepare-fail-file", "", "while this file exists, every unprepare fails")
	delayFile := flag.String("unprepare-delay-file", "", "a file holding a Go duration each unprepare sleeps first")
	podUID := flag.String("pod-uid", os.Getenv("POD_UID"), "pod UID: enables rolling-update registration (default $POD_UID)")
	flag.Parse()
	if *pluginDir == "" {
		*pluginDir = filepath.Join("/var/lib/kubelet/plugins", *name)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	if *startDelay > 0 {
		log.Printf("dradriver: sleeping %s before starting", *startDelay)
		select {
		case <-time.After(*startDelay):
		case <-ctx.Done():
			return
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("dradriver: kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Fatalf("dradriver: client: %v", err)
	}
	if err := os.MkdirAll(*pluginDir, 0o750); err != nil {
		log.Fatalf("dradriver: %v", err)
	}
	if err := os.MkdirAll(*cdiDir, 0o755); err != nil {
		log.Fatalf("dradriver: %v", err)
	}
	d := &driver{name: *name, cdiDir: *cdiDir, failFile: *failFile, delayFile: *delayFile}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(*name), kubeletplugin.NodeName(*nodeName), kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir), kubeletplugin.RegistrarDirectoryPath(*registryDir),
		kubeletplugin.HealthService(false),
	}
	if *podUID != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(*podUID)))
	}
	helper, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		log.Fatalf("dradriver: start: %v", err)
	}
	defer helper.Stop()

	var devs []resourceapi.Device
	for i := 0; i < *devices; i++ {
		devs = append(devs, resourceapi.Device{Name: "dev-" + strconv.Itoa(i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"index": {IntValue: ptr(int64(i))}}})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		*nodeName: {Slices: []resourceslice.Slice{{Devices: devs}}}}}); err != nil {
		log.Fatalf("dradriver: publish: %v", err)
	}
	log.Printf("dradriver: %s started on node %s with %d devices (plugin dir %s, registry %s, started %s)", *name,
		*nodeName, *devices, *pluginDir, *registryDir, metav1.Now().Format(time.RFC3339))

	if *healthPort > 0 {
		// SO_REUSEPORT: with hostNetwork (forced by the test cluster) two instances share the host's
		// port space; during a surge rollout the new pod must bind the same health port while the old
		// one still serves it (without it the new pod crash-loops and the rollout never finishes).
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}); err != nil {
				return err
			}
			return serr
		}}
		lis, err := lc.Listen(ctx, "tcp", net.JoinHostPort(*healthAddr, strconv.Itoa(*healthPort)))
		if err != nil {
			log.Fatalf("dradriver: health listener: %v", err)
		}
		srv := grpc.NewServer()
		hs := health.NewServer()
		healthpb.RegisterHealthServer(srv, hs)
		go func() { _ = srv.Serve(lis) }()
		defer srv.Stop()
		log.Printf("dradriver: gRPC health service on %s", lis.Addr())
		go watchHealth(ctx, hs, *unhealthyFile)
	}
	<-ctx.Done()
	log.Printf("dradriver: stopping")
}

// watchHealth sets services "" and "liveness" to SERVING, or NOT_SERVING while `file` exists.
func watchHealth(ctx context.Context, hs *health.Server, file string) {
	last := healthpb.HealthCheckResponse_UNKNOWN
	for {
		status := healthpb.HealthCheckResponse_SERVING
		if file != "" {
			if _, err := os.Stat(file); err == nil {
				status = healthpb.HealthCheckResponse_NOT_SERVING
			}
		}
		if status != last {
			hs.SetServingStatus("", status)
			hs.SetServingStatus("liveness", status)
			log.Printf("dradriver: health %s", status)
			last = status
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func ptr[T any](v T) *T { return &v }
