// Command webhook-go is the Go-equivalent line of bench/webhook_servers.py (issue 18, item 5):
// the operator's injector route served the way the reference operator serves its own, with
// controller-runtime's webhook server (TLS from a certificate directory, its HTTP server and
// admission decoding) and a handler that decodes the Deployment into k8s.io/api types, adds the
// same injection (labels, volume, init container, environment, mount; an Active Lumigo is assumed,
// as in the Python bench) and answers with admission.PatchResponseFromRaw, whose JSON patch the
// reference computes the same way. It is not the reference's code: it is built here, from the
// Go module proxy, so the comparison can be re-run on any machine. Bench only; nothing ships it.
//
//	webhook-go -cert-dir DIR -port N
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	volumeName = "lumigo-injector"
	mountPath  = "/opt/lumigo"
	proxy      = "http://lumigo-lumigo-operator-telemetry-proxy-service.lumigo-system.svc.cluster.local"
	label      = "lumigo.auto-trace"
	version    = "lumigo-operator.v0.1.0"
)

type injector struct{ decoder admission.Decoder }

func (i *injector) Handle(_ context.Context, req admission.Request) admission.Response {
	var deployment appsv1.Deployment
	if err := i.decoder.Decode(req, &deployment); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	inject(&deployment)
	mutated, err := json.Marshal(&deployment)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

// inject adds what the Python injector adds for an Active Lumigo with tracing on.
func inject(d *appsv1.Deployment) {
	if d.Labels == nil {
		d.Labels = map[string]string{}
	}
	d.Labels[label] = version
	pod := &d.Spec.Template
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[label] = version
	spec := &pod.Spec
	spec.Volumes = append(spec.Volumes, corev1.Volume{
		Name:         volumeName,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	})
	spec.InitContainers = append(spec.InitContainers, corev1.Container{
		Name:         "lumigo-injector",
		Image:        "public.ecr.aws/lumigo/lumigo-autotrace:latest",
		Env:          []corev1.EnvVar{{Name: "TARGET_DIRECTORY", Value: "/target"}},
		VolumeMounts: []corev1.VolumeMount{{Name: volumeName, MountPath: "/target"}},
	})
	for c := range spec.Containers {
		container := &spec.Containers[c]
		container.Env = append(container.Env,
			corev1.EnvVar{Name: "LD_PRELOAD", Value: mountPath + "/injector/lumigo_injector.so"},
			corev1.EnvVar{Name: "LUMIGO_TRACER_TOKEN", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "lumigo-credentials"},
					Key:                  "token",
				},
			}},
			corev1.EnvVar{Name: "LUMIGO_ENDPOINT", Value: proxy + "/v1/traces"},
			corev1.EnvVar{Name: "LUMIGO_LOGS_ENDPOINT", Value: proxy + "/v1/logs"},
			corev1.EnvVar{Name: "LUMIGO_ENABLE_LOGS", Value: "false"},
			corev1.EnvVar{Name: "LUMIGO_ENABLE_TRACES", Value: "true"},
			corev1.EnvVar{Name: "LUMIGO_CONTAINER_NAME", Value: container.Name},
		)
		container.VolumeMounts = append(container.VolumeMounts,
			corev1.VolumeMount{Name: volumeName, MountPath: mountPath, ReadOnly: true})
	}
}

func main() {
	certDir := flag.String("cert-dir", "", "directory with tls.crt and tls.key")
	port := flag.Int("port", 9443, "HTTPS port")
	flag.Parse()
	server := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: *port, CertDir: *certDir})
	server.Register("/v1alpha1/inject", &webhook.Admission{
		Handler: &injector{decoder: admission.NewDecoder(scheme())},
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := server.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "webhook-go:", err)
		os.Exit(1)
	}
}
