package lumigok8senricher

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/lru"
)

// The kinds an owner chain is walked through ("apiVersion/kind" -> resource). Any other kind
// (a Node, a custom resource) is its own root: nothing is read about it.
var kinds = map[string]schema.GroupVersionResource{
	"v1/Pod":              {Version: "v1", Resource: "pods"},
	"apps/v1/ReplicaSet":  {Group: "apps", Version: "v1", Resource: "replicasets"},
	"apps/v1/Deployment":  {Group: "apps", Version: "v1", Resource: "deployments"},
	"apps/v1/DaemonSet":   {Group: "apps", Version: "v1", Resource: "daemonsets"},
	"apps/v1/StatefulSet": {Group: "apps", Version: "v1", Resource: "statefulsets"},
	"batch/v1/Job":        {Group: "batch", Version: "v1", Resource: "jobs"},
	"batch/v1/CronJob":    {Group: "batch", Version: "v1", Resource: "cronjobs"},
}

// Longer owner chains than this are not followed (Pod -> Job -> CronJob is 3).
const maxDepth = 5

// ref names an object: an Event's involvedObject or an ownerReference.
type ref struct{ apiVersion, kind, name, uid string }

// known is what is remembered of an object: enough to walk its owners and to know whether its
// version was sent.
type known struct {
	uid, resourceVersion string
	owner                *ref // its first owner of a walked kind (the controller first)
	unreadable           bool // a failed read (not found, forbidden, timeout): not retried until it expires
	at                   time.Time
}

type enricher struct {
	cfg    *Config
	logger *zap.Logger
	client dynamic.Interface
	// namespace/apiVersion/kind/name -> *known; "uid/resourceVersion" of the versions sent (or
	// looked for once).
	objects *lru.Cache
	sent    *lru.Cache
}

func newEnricher(cfg *Config, logger *zap.Logger) *enricher {
	return &enricher{cfg: cfg, logger: logger, objects: lru.New(cfg.CacheSize), sent: lru.New(4 * cfg.CacheSize)}
}

func (e *enricher) start(context.Context, component.Host) error {
	var config *rest.Config
	var err error
	if e.cfg.AuthType == "serviceAccount" {
		config, err = rest.InClusterConfig()
	} else {
		config, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	}
	if err != nil {
		return fmt.Errorf("lumigo_k8s_enricher: no Kubernetes client configuration: %w", err)
	}
	// Reads are few (a cache in front, a budget per Event): the client's own throttle must not
	// be what makes an Event wait.
	config.QPS, config.Burst = 50, 100
	e.client, err = dynamic.NewForConfig(config)
	return err
}

func (e *enricher) processLogs(ctx context.Context, ld plog.Logs) (plog.Logs, error) {
	type emitted struct {
		namespace, resource string
		scope               pcommon.InstrumentationScope
		object              map[string]any
	}
	var emit []emitted
	resources := ld.ResourceLogs()
	for i := 0; i < resources.Len(); i++ {
		scopes := resources.At(i).ScopeLogs()
		for j := 0; j < scopes.Len(); j++ {
			scope := scopes.At(j)
			records := scope.LogRecords()
			for k := 0; k < records.Len(); k++ {
				body := records.At(k).Body()
				if body.Type() != pcommon.ValueTypeMap {
					continue
				}
				switch scope.Scope().Name() {
				case e.cfg.ObjectsScope:
					e.learn(body.Map().AsRaw())
				case e.cfg.EventsScope:
					if ns, resource, object := e.enrich(ctx, body.Map()); object != nil {
						emit = append(emit, emitted{ns, resource, scope.Scope(), object})
					}
				}
			}
		}
	}
	for _, o := range emit {
		rl := ld.ResourceLogs().AppendEmpty()
		rl.Resource().Attributes().PutStr("k8s.namespace.name", o.namespace)
		sl := rl.ScopeLogs().AppendEmpty()
		sl.Scope().SetName(e.cfg.ObjectsScope)
		sl.Scope().SetVersion(o.scope.Version())
		record := sl.LogRecords().AppendEmpty()
		record.SetObservedTimestamp(pcommon.NewTimestampFromTime(time.Now()))
		record.Attributes().PutStr("k8s.resource.name", o.resource)
		if err := record.Body().SetEmptyMap().FromRaw(o.object); err != nil {
			e.logger.Debug("cannot send an involved object", zap.Error(err))
		}
	}
	return ld, nil
}

// learn remembers an object record's owners and marks its version sent.
func (e *enricher) learn(object map[string]any) {
	meta := mapOf(object["metadata"])
	apiVersion, kind := str(object["apiVersion"]), str(object["kind"])
	if _, walked := kinds[apiVersion+"/"+kind]; !walked {
		return
	}
	k := compact(object)
	e.objects.Add(key(str(meta["namespace"]), ref{apiVersion: apiVersion, kind: kind, name: str(meta["name"])}), k)
	e.sent.Add(k.uid+"/"+k.resourceVersion, true)
}

// enrich sets an Event's rootOwnerReference, reading only in the Event's own namespace (its
// involvedObject is written by whoever wrote the Event: one naming another namespace gets
// nothing read). It returns the involved object when the version the Event names was read now
// and has not been sent, with its namespace and resource.
func (e *enricher) enrich(ctx context.Context, event pcommon.Map) (string, string, map[string]any) {
	raw := event.AsRaw()
	if str(raw["kind"]) != "Event" {
		return "", "", nil
	}
	ns := str(mapOf(raw["metadata"])["namespace"])
	involved := mapOf(raw["involvedObject"])
	current := ref{str(involved["apiVersion"]), str(involved["kind"]), str(involved["name"]), str(involved["uid"])}
	if ns == "" || current.kind == "" || current.name == "" {
		return "", "", nil
	}
	if other := str(involved["namespace"]); other != "" && other != ns {
		return "", "", nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()

	var sendObject map[string]any
	var resource string
	if version := str(involved["resourceVersion"]); version != "" && current.uid != "" {
		if _, done := e.sent.Get(current.uid + "/" + version); !done {
			// Once: a version the API no longer serves (a GET returns the current one) cannot
			// be sent later either.
			e.sent.Add(current.uid+"/"+version, true)
			if k, object := e.read(ctx, ns, current); k != nil && k.uid == current.uid && k.resourceVersion == version {
				sendObject, resource = object, kinds[current.apiVersion+"/"+current.kind].Resource
			}
		}
	}
	for depth := 0; depth < maxDepth; depth++ {
		k := e.lookup(ctx, ns, current)
		if k == nil || k.owner == nil {
			break // unreadable (what is known is sent) or the root
		}
		current = *k.owner
	}
	root := event.PutEmptyMap("rootOwnerReference")
	root.PutStr("apiVersion", current.apiVersion)
	root.PutStr("kind", current.kind)
	root.PutStr("name", current.name)
	root.PutStr("namespace", ns)
	root.PutStr("uid", current.uid)
	return ns, resource, sendObject
}

// lookup returns what is known of the object `r` names, from the cache or one read. An object
// found under r's name with another uid is not r (deleted, then created again): nothing.
func (e *enricher) lookup(ctx context.Context, ns string, r ref) *known {
	if _, walked := kinds[r.apiVersion+"/"+r.kind]; !walked {
		return nil
	}
	if v, ok := e.objects.Get(key(ns, r)); ok {
		k := v.(*known)
		if time.Since(k.at) < e.cfg.CacheTTL && (k.unreadable || r.uid == "" || k.uid == r.uid) {
			return matching(k, r)
		}
	}
	k, _ := e.read(ctx, ns, r)
	return matching(k, r)
}

func matching(k *known, r ref) *known {
	if k == nil || k.unreadable || (r.uid != "" && k.uid != r.uid) {
		return nil
	}
	return k
}

// read GETs the object once (no retry: the Event must not wait), and remembers the outcome.
func (e *enricher) read(ctx context.Context, ns string, r ref) (*known, map[string]any) {
	gvr, walked := kinds[r.apiVersion+"/"+r.kind]
	if !walked || e.client == nil || ctx.Err() != nil {
		return nil, nil
	}
	object, err := e.client.Resource(gvr).Namespace(ns).Get(ctx, r.name, metav1.GetOptions{})
	if err != nil {
		e.logger.Debug("cannot read an owner", zap.String("namespace", ns), zap.String("kind", r.kind),
			zap.String("name", r.name), zap.Error(err))
		e.objects.Add(key(ns, r), &known{unreadable: true, at: time.Now()})
		return nil, nil
	}
	k := compact(object.Object)
	e.objects.Add(key(ns, r), k)
	return k, object.Object
}

func compact(object map[string]any) *known {
	meta := mapOf(object["metadata"])
	k := &known{uid: str(meta["uid"]), resourceVersion: str(meta["resourceVersion"]), at: time.Now()}
	owners, _ := meta["ownerReferences"].([]any)
	for _, controllerOnly := range []bool{true, false} {
		for _, o := range owners {
			owner := mapOf(o)
			r := ref{str(owner["apiVersion"]), str(owner["kind"]), str(owner["name"]), str(owner["uid"])}
			if _, walked := kinds[r.apiVersion+"/"+r.kind]; walked && (!controllerOnly || owner["controller"] == true) {
				k.owner = &r
				return k
			}
		}
	}
	return k
}

func key(ns string, r ref) string { return ns + "/" + r.apiVersion + "/" + r.kind + "/" + r.name }

func mapOf(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
