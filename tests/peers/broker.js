// An aedes MQTT broker on a loopback port, for the tests: an MQTT implementation
// independent of mosquitto and of the host's own client.
//
//   node broker.js PORT
//
// Prints "aedes VERSION ready on 127.0.0.1:PORT" once it listens; SIGTERM or SIGINT
// closes it and exits 0. In memory only: a restart forgets sessions and retained messages.
import { readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { Aedes } from 'aedes'

const port = Number(process.argv[2])
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  console.error('usage: node broker.js PORT')
  process.exit(2)
}

const pkg = new URL('./node_modules/aedes/package.json', import.meta.url)
const version = JSON.parse(readFileSync(pkg, 'utf8')).version

const broker = await Aedes.createBroker()
const server = createServer((socket) => {
  // as the tests' mosquitto (set_tcp_nodelay): no Nagle delay on each hop
  socket.setNoDelay(true)
  broker.handle(socket)
})

server.on('error', (err) => {
  console.error(`aedes: ${err.message}`)
  process.exit(1)
})

server.listen(port, '127.0.0.1', () => {
  console.log(`aedes ${version} ready on 127.0.0.1:${port}`)
})

function stop () {
  // clients may hold their sockets open: do not wait for them longer than a moment
  setTimeout(() => process.exit(0), 1000).unref()
  server.close()
  broker.close(() => process.exit(0))
}

process.on('SIGTERM', stop)
process.on('SIGINT', stop)
