// Run by tests/test_e2e_clients.py. Node before 22.21 has no
// NODE_USE_ENV_PROXY, so this client reads the proxy from HTTPS_PROXY itself,
// as Node programs of that age do (with an agent), and speaks CONNECT and
// SOCKS5 (to the SOCKS door it is told of, SOCKS_DOOR) with Node's own http,
// net and tls.
const http = require('http'), net = require('net'), tls = require('tls'), fs = require('fs');
const ca = fs.readFileSync(process.env.CA);
function overTls(socket, done) {
  const t = tls.connect({socket, servername: 'api.github.com', ca}, () =>
    t.write('GET /whoami HTTP/1.1\r\nHost: api.github.com\r\nConnection: close\r\n\r\n'));
  let data = ''; t.on('data', d => data += d); t.on('end', () => done(data));
  t.on('error', e => { console.error('tls', e.message); process.exit(3); });
}
function viaConnect(done) {
  const proxy = new URL(process.env.HTTPS_PROXY);
  const req = http.request({host: proxy.hostname, port: proxy.port, method: 'CONNECT',
                            path: 'api.github.com:443'});
  req.on('connect', (res, socket) => {
    if (res.statusCode !== 200) { console.error('CONNECT', res.statusCode); process.exit(4); }
    overTls(socket, done);
  });
  req.on('error', e => { console.error('connect', e.message); process.exit(5); });
  req.end();
}
function viaSocks(done) {
  const proxy = new URL(process.env.SOCKS_DOOR);
  const s = net.connect(Number(proxy.port), proxy.hostname);
  const host = Buffer.from('api.github.com');
  let step = 0;
  s.on('connect', () => s.write(Buffer.from([5, 1, 0])));
  s.on('data', d => {
    if (step === 0 && d[1] === 0) {
      step = 1;
      s.write(Buffer.concat([Buffer.from([5, 1, 0, 3, host.length]), host, Buffer.from([1, 187])]));
    } else if (step === 1) {
      if (d[1] !== 0) { console.error('SOCKS reply', d[1]); process.exit(6); }
      step = 2; s.removeAllListeners('data'); overTls(s, done);
    }
  });
  s.on('error', e => { console.error('socks', e.message); process.exit(7); });
}
viaConnect(a => viaSocks(b => { console.log(JSON.stringify([a, b])); }));
