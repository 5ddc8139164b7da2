// A user's Node.js application: knows nothing about Lumigo. Reports what it sees of its environment.
'use strict';
const http = require('http');

const server = http.createServer((req, res) => {
  const body = JSON.stringify({
    env: {
      NODE_OPTIONS: process.env.NODE_OPTIONS || null,
      LD_PRELOAD: process.env.LD_PRELOAD || null,
      USER_PRELOAD_LOADED: process.env.USER_PRELOAD_LOADED || null,
    },
    user_require: Boolean(global.USER_REQUIRE_LOADED),
    path: req.url,
  });
  res.writeHead(200, { 'Content-Type': 'application/json' });
  res.end(body);
});
server.listen(Number(process.env.PORT), '127.0.0.1');
