/*
 * Lumigo injector bootstrap for Node.js. lumigo_injector.so adds
 * `--require <payload>/nodejs/lumigo-bootstrap.js` to NODE_OPTIONS of Node.js processes that have a
 * LUMIGO_TRACER_TOKEN.
 *
 * Why a bootstrap instead of requiring the distro directly: a failing `--require` makes Node exit,
 * and tracing must never break the application. Here an unsupported Node.js version or any error
 * while loading the distro only means "not traced", said once on stderr. Written in ES5 so that
 * every Node.js version parses it.
 *
 * All tracer traffic goes to LUMIGO_ENDPOINT / LUMIGO_LOGS_ENDPOINT (the telemetry proxy): the
 * distro's dependency report, which only ever goes straight to Lumigo's public endpoint, is off
 * unless the user sets LUMIGO_REPORT_DEPENDENCIES. And a failed export (proxy down) is one line
 * on stderr, never a stack trace in the application's output (unless LUMIGO_DEBUG=true).
 *
 * An application that requires the distro by name gets this one (nodejs/node_path, the last entry
 * of NODE_PATH, see `byName`): one tracer for its own spans and the instrumentation's. An
 * application with its own copy (in its node_modules, or on the user's NODE_PATH entries) keeps
 * it: that copy is the one started here, instead of ours, so the process is traced once.
 */
'use strict';

var SUPPORTED_MAJORS = { min: 20, max: 24 }; // engines of @lumigo/opentelemetry (package.json)
var DISTRO = '@lumigo/opentelemetry';
// The distro posts a dependency report to a fixed public URL (not LUMIGO_ENDPOINT) unless this is
// "false"; a pod usually cannot reach it, and the report would bypass the proxy if it could.
var REPORT_DEPENDENCIES = 'LUMIGO_REPORT_DEPENDENCIES';

function flag(name) {
  var value = String(process.env[name] || '').toLowerCase();
  return value === 'true' || value === '1';
}

function debug(message) {
  if (flag('LUMIGO_INJECTOR_DEBUG')) {
    process.stderr.write('lumigo-injector: node: ' + message + '\n');
  }
}

/*
 * OpenTelemetry reports a failed export to its global error handler, whose default prints the
 * error with its stack, as JSON, for every batch. Ours prints its message on one line, once per
 * distinct message. Set on the @opentelemetry/core that the distro's SDK and exporters use (the
 * bundle's own copy); an application's own copy is not touched.
 */
function quietExportErrors(distro) {
  var seen = {};
  try {
    distro.setGlobalErrorHandler(function (error) {
      var text = error && error.message ? error.message : String(error);
      if (Object.prototype.hasOwnProperty.call(seen, text)) return;
      seen[text] = true;
      process.stderr.write(
        'lumigo-injector: node: telemetry export failed: ' + text +
          ' (repeats are not printed; LUMIGO_DEBUG=true prints all)\n'
      );
    });
  } catch (error) {
    debug('export errors keep their default handler: ' + (error && error.message));
  }
}

/*
 * One line on stderr, and the same once to the backend: a span-less heartbeat, one OTLP/HTTP log
 * record (JSON) to LUMIGO_LOGS_ENDPOINT (the telemetry proxy, which adds the pod and its owners),
 * so that a process running untraced, and why, is visible without reading its logs. The request
 * never keeps the process alive (its socket is unref'd) and its failure is ignored.
 */
function notActivated(reason) {
  process.stderr.write('lumigo-injector: node: tracing not activated: ' + reason + '\n');
  try {
    reportNotActivated(reason);
  } catch (error) {
    debug('could not report the stand-down: ' + (error && error.message));
  }
}

function reportNotActivated(reason) {
  var endpoint = String(process.env.LUMIGO_LOGS_ENDPOINT || '');
  var token = String(process.env.LUMIGO_TRACER_TOKEN || '').trim();
  if (endpoint.indexOf('http://') !== 0 || !token) return;
  function attribute(key, value) {
    return { key: key, value: { stringValue: String(value) } };
  }
  var resource = [
    attribute('process.runtime.name', 'nodejs'),
    attribute('process.runtime.version', process.versions.node),
    attribute('process.pid', process.pid)
  ];
  if (process.env.LUMIGO_CONTAINER_NAME) {
    resource.push(attribute('k8s.container.name', process.env.LUMIGO_CONTAINER_NAME));
  }
  var record = {
    severityNumber: 13,
    severityText: 'WARN',
    body: { stringValue: 'tracing not activated: ' + reason },
    attributes: [
      attribute('lumigo.injector.runtime', 'node'),
      attribute('lumigo.injector.reason', reason)
    ]
  };
  var body = JSON.stringify({
    resourceLogs: [{
      resource: { attributes: resource },
      scopeLogs: [{ scope: { name: 'lumigo-injector' }, logRecords: [record] }]
    }]
  });
  var request = require('http').request(endpoint, {
    method: 'POST',
    timeout: 2000,
    headers: {
      'Content-Type': 'application/json',
      'Content-Length': Buffer.byteLength(body),
      Authorization: 'LumigoToken ' + token
    }
  });
  request.on('socket', function (socket) { socket.unref(); });
  request.on('timeout', function () { request.destroy(); });
  request.on('error', function (error) { debug('stand-down report failed: ' + error.message); });
  request.on('response', function (response) { response.resume(); });
  request.end(body);
}

/*
 * The application's own copy of the distro: what its main module (or the working directory, from
 * which a user's `--require @lumigo/opentelemetry` resolves) gets for the name, unless that is
 * in this payload. NODE_PATH ends with ours, so whatever is found first is the application's.
 */
function ownDistro() {
  var path = require('path');
  var starts = [];
  var main = process.argv[1];
  if (main) {
    try {
      starts.push(require('fs').realpathSync(main));
    } catch (error) {
      starts.push(path.resolve(main));
    }
  }
  starts.push(process.cwd());
  var payload = __dirname + path.sep;
  for (var i = 0; i < starts.length; i++) {
    try {
      var found = require.resolve(DISTRO, { paths: [starts[i]] });
      if (found.indexOf(payload) !== 0) return found;
    } catch (error) {
      // not resolvable from there
    }
  }
  return null;
}

// Runs `load` (which starts a distro) with the dependency report defaulted off, only while the
// distro initialises (synchronously, in require), so the application and its child processes see
// their environment unchanged.
function withoutDependencyReport(load) {
  var defaulted = !Object.prototype.hasOwnProperty.call(process.env, REPORT_DEPENDENCIES);
  if (defaulted) process.env[REPORT_DEPENDENCIES] = 'false';
  try {
    return load();
  } finally {
    if (defaulted) delete process.env[REPORT_DEPENDENCIES];
  }
}

// The distro's exports (its `init` promise) once one is started; `false` when tracing was not
// activated (unsupported Node.js, an error); null before any attempt (no token).
var started = null;

// The distro bundled into one file (lumigo-distro-entry.js): its start-up reads one file instead
// of resolving ~1,000 modules; node_modules stays next to it for what it loads later.
function startOurs() {
  var distro = require('./lumigo-distro.js');
  var exported = withoutDependencyReport(function () { return distro.start(); });
  if (!flag('LUMIGO_DEBUG')) quietExportErrors(distro);
  return exported;
}

/*
 * ES modules do not read NODE_PATH: `import '@lumigo/opentelemetry'` would fail. Where Node.js has
 * synchronous, in-thread module hooks (module.registerHooks: 22.15 and later, 23.5 and later), a
 * resolve hook gives that one name the package in nodejs/node_path when nothing else resolves it
 * (an application's own copy still wins). Older Node.js (20) has only off-thread hooks, which
 * would start a thread in every process: there, an ES module must not import the distro by name.
 */
function resolvableFromEsm() {
  var Module = require('module');
  if (typeof Module.registerHooks !== 'function') return;
  var path = require('path');
  var entry = path.join(__dirname, 'node_path', DISTRO, 'index.js');
  var url = require('url').pathToFileURL(entry).href;
  Module.registerHooks({
    resolve: function (specifier, context, nextResolve) {
      if (specifier !== DISTRO) return nextResolve(specifier, context);
      try {
        return nextResolve(specifier, context);
      } catch (error) {
        if (!error || error.code !== 'ERR_MODULE_NOT_FOUND') throw error;
        return { url: url, format: 'commonjs', shortCircuit: true };
      }
    }
  });
}

(function activate() {
  try {
    var major = parseInt(String(process.versions.node).split('.')[0], 10);
    if (!process.env.LUMIGO_TRACER_TOKEN) {
      debug('LUMIGO_TRACER_TOKEN is not set; not tracing');
      return;
    }
    if (!(major >= SUPPORTED_MAJORS.min && major <= SUPPORTED_MAJORS.max)) {
      started = false;
      notActivated(
        'Node.js ' + process.versions.node + ' is not supported (' + SUPPORTED_MAJORS.min +
          ' to ' + SUPPORTED_MAJORS.max + ')'
      );
      return;
    }
    var own = ownDistro();
    if (own) {
      started = withoutDependencyReport(function () { return require(own); });
      debug('tracing with the application\'s own ' + DISTRO + ' from ' + own);
      return;
    }
    started = startOurs();
    resolvableFromEsm();
    debug('tracing with ' + DISTRO + ' from ' + __dirname);
  } catch (error) {
    started = false;
    notActivated(String(error && error.message).split('\n')[0]);
  }
})();

/*
 * What `require('@lumigo/opentelemetry')` by name gives the application (nodejs/node_path): the
 * distro started above, the same instance, so its `init` resolves to the running SDK; started now
 * when there is no token (as the distro itself is: it then sends nothing); and when tracing could
 * not be activated, an `init` that resolves to nothing (what the distro does on a Node.js it does
 * not support), so that the application still runs.
 */
exports.byName = function () {
  if (started === null) {
    try {
      started = startOurs();
    } catch (error) {
      started = false;
      debug('the distro could not be started: ' + (error && error.message));
    }
  }
  return started || { init: Promise.resolve() };
};
