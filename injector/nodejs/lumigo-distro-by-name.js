// `require('@lumigo/opentelemetry')` in a traced application, by name: lumigo_injector.so ends
// NODE_PATH with <payload>/nodejs/node_path, where injector/build-payload installs this file as
// the package's entry point. A copy in the application's node_modules is found first and wins.
// This gives the application the distro the bootstrap started (the same instance: its own spans
// and the instrumentation's share one tracer), never a second copy. ES5, like the bootstrap.
'use strict';

exports.init = require('../../../lumigo-bootstrap.js').byName().init;
