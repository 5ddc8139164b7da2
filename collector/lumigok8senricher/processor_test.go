package lumigok8senricher

import (
	"context"
	"testing"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.uber.org/zap"
)

func object(kind, apiVersion, name, uid string, owner map[string]any) map[string]any {
	meta := map[string]any{"namespace": "ns", "name": name, "uid": uid, "resourceVersion": "1"}
	if owner != nil {
		meta["ownerReferences"] = []any{owner}
	}
	return map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta}
}

func owner(kind, apiVersion, name, uid string) map[string]any {
	return map[string]any{"apiVersion": apiVersion, "kind": kind, "name": name, "uid": uid, "controller": true}
}

func event(namespace string, involved map[string]any) map[string]any {
	return map[string]any{"apiVersion": "v1", "kind": "Event",
		"metadata": map[string]any{"namespace": namespace, "name": "e"}, "involvedObject": involved}
}

// Object records teach the owner chain; an Event after them gets its root without any API read
// (no client here: a read would find nothing).
func TestRootOwnerFromObjectRecords(t *testing.T) {
	cfg := NewFactory().CreateDefaultConfig().(*Config)
	e := newEnricher(cfg, zap.NewNop())
	ld := plog.NewLogs()
	objects := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	objects.Scope().SetName(cfg.ObjectsScope)
	for _, o := range []map[string]any{
		object("Pod", "v1", "p", "u-p", owner("ReplicaSet", "apps/v1", "rs", "u-rs")),
		object("ReplicaSet", "apps/v1", "rs", "u-rs", owner("Deployment", "apps/v1", "d", "u-d")),
		object("Deployment", "apps/v1", "d", "u-d", nil),
		object("Job", "batch/v1", "j", "u-j", owner("CronJob", "batch/v1", "cj", "u-cj")),
	} {
		_ = objects.LogRecords().AppendEmpty().Body().SetEmptyMap().FromRaw(o)
	}
	events := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty()
	events.Scope().SetName(cfg.EventsScope)
	for _, ev := range []map[string]any{
		event("ns", map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-p", "resourceVersion": "1"}),
		// The CronJob was never seen nor can be read: the root is the owner the Job names.
		event("ns", map[string]any{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-j"}),
		// Another namespace's pod of the same name: nothing is read, no root is set.
		event("ns", map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-p", "namespace": "other"}),
		// A pod of that name with another uid is not the one the Event names.
		event("ns", map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-x"}),
	} {
		_ = events.LogRecords().AppendEmpty().Body().SetEmptyMap().FromRaw(ev)
	}
	if _, err := e.processLogs(context.Background(), ld); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "namespace": "ns", "uid": "u-d"},
		{"apiVersion": "batch/v1", "kind": "CronJob", "name": "cj", "namespace": "ns", "uid": "u-cj"},
		nil,
		{"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns", "uid": "u-x"},
	}
	for i, w := range want {
		got, found := events.LogRecords().At(i).Body().Map().Get("rootOwnerReference")
		if w == nil {
			if found {
				t.Errorf("event %d: rootOwnerReference %v, want none", i, got.AsRaw())
			}
			continue
		}
		if !found || len(got.Map().AsRaw()) != len(w) {
			t.Fatalf("event %d: rootOwnerReference missing or wrong: %v", i, got.AsRaw())
		}
		for k, v := range w {
			if got.Map().AsRaw()[k] != v {
				t.Errorf("event %d: %s = %v, want %v", i, k, got.Map().AsRaw()[k], v)
			}
		}
	}
	if ld.ResourceLogs().Len() != 2 {
		t.Errorf("an already sent version was sent again: %d resources", ld.ResourceLogs().Len())
	}
}
