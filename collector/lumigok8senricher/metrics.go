package lumigok8senricher

import (
	"context"

	"go.opentelemetry.io/collector/pdata/pmetric"
)

// The kube-state-metrics series naming a pod's, ReplicaSet's or Job's owner (labels owner_kind,
// owner_name and the object's namespace): each data point gets owner_uid, the owner's uid.
var ownerMetrics = map[string]bool{"kube_pod_owner": true, "kube_replicaset_owner": true, "kube_job_owner": true}

// The owner kinds whose uid is read, with their apiVersion (other kinds, such as a static pod's
// Node, and kube-state-metrics' "<none>", get nothing).
var ownerKinds = map[string]string{
	"ReplicaSet": "apps/v1", "Deployment": "apps/v1", "DaemonSet": "apps/v1", "StatefulSet": "apps/v1",
	"Job": "batch/v1", "CronJob": "batch/v1",
}

// processMetrics sets owner_uid on the owner series' data points, reading each owner (from the
// cache, else one GET) only in the data point's own namespace. All reads of one batch share the
// timeout: a point whose owner cannot be read in time (or at all) is left as it is.
func (e *enricher) processMetrics(ctx context.Context, md pmetric.Metrics) (pmetric.Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	resources := md.ResourceMetrics()
	for i := 0; i < resources.Len(); i++ {
		scopes := resources.At(i).ScopeMetrics()
		for j := 0; j < scopes.Len(); j++ {
			metrics := scopes.At(j).Metrics()
			for k := 0; k < metrics.Len(); k++ {
				m := metrics.At(k)
				if ownerMetrics[m.Name()] && m.Type() == pmetric.MetricTypeGauge {
					e.setOwnerUIDs(ctx, m.Gauge().DataPoints())
				}
			}
		}
	}
	return md, nil
}

func (e *enricher) setOwnerUIDs(ctx context.Context, points pmetric.NumberDataPointSlice) {
	for i := 0; i < points.Len(); i++ {
		attributes := points.At(i).Attributes()
		kind, _ := attributes.Get("owner_kind")
		name, _ := attributes.Get("owner_name")
		ns, _ := attributes.Get("namespace")
		apiVersion, owned := ownerKinds[kind.Str()]
		if !owned || name.Str() == "" || ns.Str() == "" {
			continue
		}
		if k := e.lookup(ctx, ns.Str(), ref{apiVersion: apiVersion, kind: kind.Str(), name: name.Str()}); k != nil && k.uid != "" {
			attributes.PutStr("owner_uid", k.uid)
		}
	}
}
