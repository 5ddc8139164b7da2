// The entry point injector/build-payload bundles (esbuild) into nodejs/lumigo-distro.js: the
// distro and every module it loads at start-up in one file, so a traced process reads and
// compiles one file instead of resolving about a thousand (the start-up cost of issue 19).
// `start` loads (and so initialises) the distro; `setGlobalErrorHandler` is the bundle's own copy
// of @opentelemetry/core's, the one the distro's exporters report to.
'use strict';

module.exports = {
  start: function () {
    return require('@lumigo/opentelemetry');
  },
  setGlobalErrorHandler: function (handler) {
    require('@opentelemetry/core').setGlobalErrorHandler(handler);
  },
};
