// Package lumigok8senricher is the telemetry proxy's logs processor for Kubernetes Events: it
// sets each Event's rootOwnerReference (the farthest owner of its involved object, read from the
// API in the Event's own namespace) and sends the involved object's version as an object record
// when the pipeline has not carried that version yet. As a metrics processor (the cluster agent's
// kube-state-metrics pipeline), it sets owner_uid on the owner series (metrics.go).
package lumigok8senricher

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processorhelper"
)

var componentType = component.MustNewType("lumigo_k8s_enricher")

// Config of the processor.
type Config struct {
	// serviceAccount (in a cluster) or kubeConfig ($KUBECONFIG, for a collector run outside one).
	AuthType string `mapstructure:"auth_type"`
	// The time one Event's API reads may take in all; past it, the Event leaves with what is known.
	Timeout time.Duration `mapstructure:"timeout"`
	// Objects remembered (their uid, version and owners), and for how long.
	CacheSize int           `mapstructure:"cache_size"`
	CacheTTL  time.Duration `mapstructure:"cache_ttl"`
	// The scopes of Event records and of object records.
	EventsScope  string `mapstructure:"events_scope"`
	ObjectsScope string `mapstructure:"objects_scope"`
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if c.AuthType != "serviceAccount" && c.AuthType != "kubeConfig" {
		return errors.New("auth_type must be serviceAccount or kubeConfig")
	}
	if c.Timeout <= 0 || c.CacheSize <= 0 || c.CacheTTL <= 0 {
		return errors.New("timeout, cache_size and cache_ttl must be positive")
	}
	if c.EventsScope == "" || c.ObjectsScope == "" {
		return errors.New("events_scope and objects_scope are required")
	}
	return nil
}

// NewFactory returns the processor's factory.
func NewFactory() processor.Factory {
	return processor.NewFactory(componentType, func() component.Config {
		return &Config{
			AuthType:     "serviceAccount",
			Timeout:      2 * time.Second,
			CacheSize:    4096,
			CacheTTL:     time.Minute,
			EventsScope:  "lumigo-operator.k8s-events",
			ObjectsScope: "lumigo-operator.k8s-objects",
		}
	}, processor.WithLogs(createLogs, component.StabilityLevelAlpha),
		processor.WithMetrics(createMetrics, component.StabilityLevelAlpha))
}

func createLogs(ctx context.Context, set processor.Settings, cfg component.Config, next consumer.Logs) (processor.Logs, error) {
	c := cfg.(*Config)
	e := newEnricher(c, set.Logger)
	return processorhelper.NewLogs(ctx, set, cfg, next, e.processLogs,
		processorhelper.WithStart(e.start),
		processorhelper.WithCapabilities(consumer.Capabilities{MutatesData: true}))
}

func createMetrics(ctx context.Context, set processor.Settings, cfg component.Config, next consumer.Metrics) (processor.Metrics, error) {
	e := newEnricher(cfg.(*Config), set.Logger)
	return processorhelper.NewMetrics(ctx, set, cfg, next, e.processMetrics,
		processorhelper.WithStart(e.start),
		processorhelper.WithCapabilities(consumer.Capabilities{MutatesData: true}))
}
