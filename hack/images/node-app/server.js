// The Node.js test application (Express): knows nothing about Lumigo. Same paths as the other
// test apps (see hack/images/python-app/app.py): /healthz, / and /call?url=URL, on $PORT.
'use strict';
const http = require('http');
const express = require('express');

const ENV_KEYS = ['LD_PRELOAD', 'PYTHONPATH', 'NODE_OPTIONS', 'JAVA_TOOL_OPTIONS', 'OTEL_SERVICE_NAME'];
const app = express();

app.get('/healthz', (req, res) => res.type('text').send('ok\n'));

app.get('/', (req, res) => {
  const traced = Object.keys(require.cache).some((p) => p.includes('@lumigo/opentelemetry'));
  res.json({
    app: 'node-express',
    runtime: `node ${process.version}`,
    traced,
    env: Object.fromEntries(ENV_KEYS.map((k) => [k, process.env[k] ?? null])),
    token_set: 'LUMIGO_TRACER_TOKEN' in process.env,
  });
});

app.get('/call', (req, res) => {
  const url = String(req.query.url);
  http
    .get(url, { timeout: 10000 }, (upstream) => {
      let body = '';
      upstream.setEncoding('utf8');
      upstream.on('data', (chunk) => { body += chunk; });
      upstream.on('end', () => res.json({ url, status: upstream.statusCode, body: body.slice(0, 200) }));
    })
    .on('error', (err) => res.status(502).json({ url, error: err.message }));
});

// PID 1 in a container: without a handler SIGTERM is ignored until the grace period ends.
process.on('SIGTERM', () => process.exit(0));

const port = Number(process.env.PORT || 8080);
app.listen(port, '0.0.0.0', () => console.log(`listening on ${port}`));
