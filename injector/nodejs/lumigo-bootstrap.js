/*
 * Lumigo injector bootstrap for Node.js. lumigo_injector.so adds
 * `--require <payload>/nodejs/lumigo-bootstrap.js` to NODE_OPTIONS of Node.js processes that have a
 * LUMIGO_TRACER_TOKEN.
 *
 * Why a bootstrap instead of requiring the distro directly: a failing `--require` makes Node exit,
 * and tracing must never break the application. Here an unsupported Node.js version or any error
 * while loading the distro only means "not traced". Written in ES5 so that every Node.js version
 * parses it.
 */
'use strict';

var SUPPORTED_MAJORS = { min: 20, max: 24 }; // engines of @lumigo/opentelemetry (package.json)

function debug(message) {
  var flag = String(process.env.LUMIGO_INJECTOR_DEBUG || '').toLowerCase();
  if (flag === 'true' || flag === '1') {
    process.stderr.write('lumigo-injector: node: ' + message + '\n');
  }
}

(function activate() {
  try {
    var major = parseInt(String(process.versions.node).split('.')[0], 10);
    if (!(major >= SUPPORTED_MAJORS.min && major <= SUPPORTED_MAJORS.max)) {
      debug('Node.js ' + process.versions.node + ' is not supported; not tracing');
      return;
    }
    if (!process.env.LUMIGO_TRACER_TOKEN) {
      debug('LUMIGO_TRACER_TOKEN is not set; not tracing');
      return;
    }
    require('@lumigo/opentelemetry');
    debug('tracing with @lumigo/opentelemetry from ' + __dirname);
  } catch (error) {
    process.stderr.write(
      'lumigo-injector: node: tracing not activated: ' + (error && error.message) + '\n'
    );
  }
})();
