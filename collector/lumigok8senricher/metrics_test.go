package lumigok8senricher

import (
	"context"
	"testing"

	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.uber.org/zap"
)

// kube-state-metrics' owner series get their owner's uid from what the enricher knows (no client
// here: an owner it does not know cannot be read, and the point is left as it is).
func TestOwnerUIDOnOwnerMetrics(t *testing.T) {
	cfg := NewFactory().CreateDefaultConfig().(*Config)
	e := newEnricher(cfg, zap.NewNop())
	e.learn(object("ReplicaSet", "apps/v1", "rs", "u-rs", nil))
	e.learn(object("Deployment", "apps/v1", "d", "u-d", nil))
	e.learn(object("CronJob", "batch/v1", "cj", "u-cj", nil))

	md := pmetric.NewMetrics()
	metrics := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics()
	points := map[string][]map[string]any{
		"kube_pod_owner": {
			{"namespace": "ns", "pod": "p", "owner_kind": "ReplicaSet", "owner_name": "rs"},
			{"namespace": "ns", "pod": "q", "owner_kind": "<none>", "owner_name": "<none>"},
			// Same name in another namespace: not this one's owner.
			{"namespace": "other", "pod": "p", "owner_kind": "ReplicaSet", "owner_name": "rs"},
			// Unknown and unreadable: unchanged.
			{"namespace": "ns", "pod": "r", "owner_kind": "StatefulSet", "owner_name": "s"},
			{"namespace": "ns", "pod": "n", "owner_kind": "Node", "owner_name": "rs"},
			{"pod": "p", "owner_kind": "ReplicaSet", "owner_name": "rs"},
		},
		"kube_replicaset_owner": {{"namespace": "ns", "replicaset": "rs", "owner_kind": "Deployment", "owner_name": "d"}},
		"kube_job_owner":        {{"namespace": "ns", "job_name": "j", "owner_kind": "CronJob", "owner_name": "cj"}},
		"kube_pod_info":         {{"namespace": "ns", "pod": "p", "owner_kind": "ReplicaSet", "owner_name": "rs"}},
	}
	for _, name := range []string{"kube_pod_owner", "kube_replicaset_owner", "kube_job_owner", "kube_pod_info"} {
		m := metrics.AppendEmpty()
		m.SetName(name)
		g := m.SetEmptyGauge()
		for _, attrs := range points[name] {
			_ = g.DataPoints().AppendEmpty().Attributes().FromRaw(attrs)
		}
	}
	if _, err := e.processMetrics(context.Background(), md); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"kube_pod_owner":        {"u-rs", "", "", "", "", ""},
		"kube_replicaset_owner": {"u-d"},
		"kube_job_owner":        {"u-cj"},
		"kube_pod_info":         {""},
	}
	for i := 0; i < metrics.Len(); i++ {
		m := metrics.At(i)
		for j, w := range want[m.Name()] {
			got, found := m.Gauge().DataPoints().At(j).Attributes().Get("owner_uid")
			if w == "" && found {
				t.Errorf("%s point %d: owner_uid %q, want none", m.Name(), j, got.Str())
			} else if w != "" && (!found || got.Str() != w) {
				t.Errorf("%s point %d: owner_uid %v (found %v), want %q", m.Name(), j, got.AsRaw(), found, w)
			}
		}
	}
}
