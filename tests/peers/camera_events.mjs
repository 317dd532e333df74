// A camera that raises OPC UA events, on node-opcua's server (a stack independent of
// asyncua), for tests/test_opcua_equipment_events.py: the host's subscription to events
// of a named type is shown to work against a server it did not grow up with.
//
//   node camera_events.mjs --port 4842 [--every-ms 200]
//
// Namespace urn:sfc-fast:test-events: an event type s=RejectEventType (BaseEventType with
// RejectCode: Int32), its subtype s=SealRejectEventType (with Station: String), and the
// notifier object s=Camera1. Every --every-ms the camera raises a RejectEventType event
// (Message "seal torn", Severity 600, RejectCode 7) and a SealRejectEventType event
// (Message "seal crooked", Severity 700, RejectCode 9, Station "capper"). Security None,
// anonymous. Prints one ready line once listening; SIGTERM or SIGINT shuts it down and
// exits 0.

import { parseArgs } from "node:util";

import { DataType, OPCUAServer } from "node-opcua";

const URI = "urn:sfc-fast:test-events";

function eventFields(message, severity, code) {
    return {
        message: { dataType: DataType.LocalizedText, value: { text: message } },
        severity: { dataType: DataType.UInt16, value: severity },
        rejectCode: { dataType: DataType.Int32, value: code },
    };
}

async function main() {
    const { values } = parseArgs({
        options: { port: { type: "string" }, "every-ms": { type: "string", default: "200" } },
    });
    const port = Number(values.port);
    const every = Number(values["every-ms"]);
    const server = new OPCUAServer({
        port,
        resourcePath: "/camera/",
        buildInfo: { productName: "sfc-fast test camera (node-opcua)" },
    });
    await server.initialize();
    const addressSpace = server.engine.addressSpace;
    const ns = addressSpace.registerNamespace(URI);
    const reject = ns.addEventType({ browseName: "RejectEventType", nodeId: "s=RejectEventType",
                                     subtypeOf: "BaseEventType" });
    ns.addVariable({ propertyOf: reject, browseName: "RejectCode", dataType: "Int32",
                     modellingRule: "Mandatory" });
    const seal = ns.addEventType({ browseName: "SealRejectEventType",
                                   nodeId: "s=SealRejectEventType", subtypeOf: reject });
    ns.addVariable({ propertyOf: seal, browseName: "Station", dataType: "String",
                     modellingRule: "Mandatory" });
    const camera = ns.addObject({ browseName: "Camera1", nodeId: "s=Camera1",
                                  organizedBy: addressSpace.rootFolder.objects,
                                  eventNotifier: 1 });
    await server.start();
    console.log(`camera events on opc.tcp://127.0.0.1:${port}/camera/`);

    const timer = setInterval(() => {
        camera.raiseEvent(reject, eventFields("seal torn", 600, 7));
        camera.raiseEvent(seal, {
            ...eventFields("seal crooked", 700, 9),
            station: { dataType: DataType.String, value: "capper" },
        });
    }, every);

    let stopping = false;
    const shutdown = async () => {
        if (stopping) return;
        stopping = true;
        clearInterval(timer);
        await server.shutdown(0);
        process.exit(0);
    };
    process.on("SIGTERM", shutdown);
    process.on("SIGINT", shutdown);
}

main().catch((e) => {
    console.error(`camera_events: ${e.stack || e}`);
    process.exit(1);
});
