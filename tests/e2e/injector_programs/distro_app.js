// A user's Node.js application that uses the Lumigo distro by name, as Lumigo's documentation
// shows, to add its own span inside the request the auto-instrumentation traces. It does not list
// the distro in its dependencies: the one it gets is the injected one (or, when it has its own
// copy in its node_modules, that copy). Reports what it resolved and loaded.
'use strict';
const http = require('http');
const { init } = require('@lumigo/opentelemetry');

function optional(name) {
  try {
    return require(name);
  } catch (error) {
    return null;
  }
}

// Where the app has its own @opentelemetry/api (as the reference's test client does), a span
// through it too: the API's global registration is shared across copies.
const api = optional('@opentelemetry/api');

init.then((sdk) => {
  const tracer = sdk.tracerProvider.getTracer('distro-app');
  const server = http.createServer((req, res) => {
    tracer.startActiveSpan('app-work', (span) => {
      span.end();
      if (api) api.trace.getTracer('distro-app-api').startSpan('api-work').end();
      const body = JSON.stringify({
        distro: require.resolve('@lumigo/opentelemetry'),
        loaded: Object.keys(require.cache),
        user_module: optional('user-module'),
        env: { NODE_PATH: process.env.NODE_PATH || null },
      });
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(body);
    });
  });
  server.listen(Number(process.env.PORT), '127.0.0.1');
});
