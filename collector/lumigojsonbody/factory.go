// Package lumigojsonbody is the cluster agent's logs processor that turns a record whose string
// body is a JSON object into a map body, as the reference's log-file collector sends it (any
// other body stays as it was). It gives the same maps as stanza's json_parser, which it replaces
// in the agent: it parses straight into the record's map instead of through Go maps and values
// that are then converted, so a JSON-object line costs a fraction of the allocations (parse.go).
package lumigojsonbody

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processorhelper"
)

var componentType = component.MustNewType("lumigo_json_body")

// Config of the processor: it has no settings.
type Config struct{}

// NewFactory returns the processor's factory.
func NewFactory() processor.Factory {
	return processor.NewFactory(componentType, func() component.Config { return &Config{} },
		processor.WithLogs(createLogs, component.StabilityLevelAlpha))
}

func createLogs(ctx context.Context, set processor.Settings, cfg component.Config, next consumer.Logs) (processor.Logs, error) {
	return processorhelper.NewLogs(ctx, set, cfg, next, processLogs,
		processorhelper.WithCapabilities(consumer.Capabilities{MutatesData: true}))
}

func processLogs(_ context.Context, logs plog.Logs) (plog.Logs, error) {
	for _, resource := range logs.ResourceLogs().All() {
		for _, scope := range resource.ScopeLogs().All() {
			for _, record := range scope.LogRecords().All() {
				SetMapBody(record)
			}
		}
	}
	return logs, nil
}
