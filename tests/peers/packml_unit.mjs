// Example PackML units (OPC 30050) on node-opcua's server, a stack independent of asyncua,
// for tests/equipment/test_opcua_equipment_node.py: the units of sfc_host.examples.packml_unit,
// written again, so the host is shown to drive a PLC whose server it did not grow up with.
//
//   node packml_unit.mjs --port 4841 --units Filler1,Capper1 [--work-ms 50] [--pki DIR]
//
// Loads node-opcua's standard nodeset and the PackML NodeSet the package ships. Each unit
// is a PackMLBaseObjectType instance with string node ids s={name}… in namespace
// urn:sfc-fast:example-units (so one equipment file serves both servers through nsu= ids):
// Start(Parameter: PackMLDescriptorDataType), Stop, Abort, Hold, Unhold, Reset, Clear on
// BaseStateMachine, SetParameter on the unit, the ISA-TR88 state as LocalizedText in
// BaseStateMachine/CurrentState, Admin/StopReason (PackMLAlarmDataType), and beside the
// model {name}.CommandId (String), {name}.Setpoint (Double, writable), {name}.Result
// (Double), {name}.Starts (UInt32), {name}.Fault (Boolean, writable: the next Start
// aborts). A command the state does not allow returns BadInvalidState. Beside the units, a
// method as a weighing station offers one: Scale1.Weigh(Tare: Double, Count: UInt16) ->
// (Net: Double) = 10 * Count - Tare, BadOutOfRange for a Count of 0. Security None,
// anonymous; the server's certificate store is --pki (else node-opcua's default). Prints
// one ready line once listening; SIGTERM or SIGINT shuts it down and exits 0.

import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import {
    DataType,
    MessageSecurityMode,
    OPCUACertificateManager,
    OPCUAServer,
    SecurityPolicy,
    StatusCodes,
    Variant,
    nodesets,
} from "node-opcua";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const NODESET = path.resolve(HERE, "..", "..", "src", "sfc_host", "equipment", "opcua",
    "nodeset", "Opc.Ua.PackML.NodeSet2.xml");
const URI = "urn:sfc-fast:example-units";
const PACKML_URI = "http://opcfoundation.org/UA/PackML/";
const STEP_MS = 10;                 // each acting state (Starting, Completing, …) lasts this long
const STOPPABLE = ["Starting", "Execute", "Completing", "Holding", "Held", "Unholding",
    "Suspended", "Idle", "Complete"];

const { values: opts } = parseArgs({
    options: {
        port: { type: "string", default: "4841" },
        units: { type: "string", default: "Filler1,Capper1" },
        "work-ms": { type: "string", default: "50" },
        pki: { type: "string" },
        // Secure: only Basic256Sha256 SignAndEncrypt, this certificate (DER or PEM) and
        // key (PEM) for application URI --uri, and only the user --user NAME:PASSWORD; a
        // client's certificate is accepted unseen (the host's trust is what is tested).
        secure: { type: "boolean", default: false },
        cert: { type: "string" },
        key: { type: "string" },
        uri: { type: "string" },
        user: { type: "string" },
    },
});
const port = Number(opts.port);
const names = opts.units.split(",").filter((n) => n);
const workMs = Number(opts["work-ms"]);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A command the unit's state does not allow: the call's status, as a PLC answers it.
class NotNow extends Error {}

class Unit {
    constructor(name, addressSpace) {
        this.name = name;
        this.addressSpace = addressSpace;
        this.state = "Idle";
        this.params = new Map();
        this.leftMs = 0;            // work left (held work goes on from here)
        this.nodes = {};
        this.gen = 0;               // bumped to cancel the work in progress
        this.workingSince = null;   // set while the work itself runs (not its acting states)
    }

    setState(state) {
        this.state = state;
        this.nodes.state.setValueFromSource({
            dataType: DataType.LocalizedText, value: { text: state, locale: "en" },
        });
    }

    read(key) {
        return this.nodes[key].readValue().value.value;
    }

    write(key, dataType, value) {
        this.nodes[key].setValueFromSource({ dataType, value });
    }

    refuseUnless(...states) {
        if (!states.includes(this.state)) throw new NotNow();
    }

    // ---- methods

    start() {
        this.refuseUnless("Idle");
        this.write("starts", DataType.UInt32, this.read("starts") + 1);
        if (this.read("fault")) {
            this.write("fault", DataType.Boolean, false);
            this.stopReason("fault injected: jam in the infeed");
            this.spawn((gen) => this.acting(gen, "Aborting", "Aborted"));
            return;
        }
        this.leftMs = workMs;
        this.spawn((gen) => this.runFrom(gen, "Starting"));
    }

    hold() {
        this.refuseUnless("Execute", "Starting");
        this.spawn((gen) => this.acting(gen, "Holding", "Held"));
    }

    unhold() {
        this.refuseUnless("Held");
        this.spawn((gen) => this.runFrom(gen, "Unholding"));
    }

    stop() {
        this.refuseUnless(...STOPPABLE);
        this.stopReason("stopped by the host");
        this.spawn((gen) => this.acting(gen, "Stopping", "Stopped"));
    }

    abort() {
        this.refuseUnless("Starting", "Execute", "Completing", "Holding", "Held", "Unholding",
            "Idle", "Complete", "Stopped", "Stopping");
        this.stopReason("aborted by the host");
        this.spawn((gen) => this.acting(gen, "Aborting", "Aborted"));
    }

    clear() {
        this.refuseUnless("Aborted");
        this.spawn((gen) => this.acting(gen, "Clearing", "Stopped"));
    }

    reset() {
        this.refuseUnless("Complete", "Stopped");
        this.params.clear();
        this.spawn((gen) => this.acting(gen, "Resetting", "Idle"));
    }

    setParameter(descriptors) {
        // the type declares an array of descriptors; a scalar is taken too, as the Python
        // unit takes one
        for (const d of [descriptors].flat()) {
            if (d) this.params.set(String(d.name), Number(d.value));
        }
    }

    // ---- work: one sequence at a time; a new one (or a cancel) makes the old one stop
    // at its next step, as the Python unit cancels its task

    spawn(work) {
        this.cancelWork();
        work(this.gen).catch((e) => console.error(`unit ${this.name}: ${e.stack || e}`));
    }

    cancelWork() {
        this.gen += 1;
        if (this.workingSince !== null) {
            this.leftMs = Math.max(0, this.leftMs - (Date.now() - this.workingSince));
            this.workingSince = null;
        }
    }

    async acting(gen, acting, then) {
        this.setState(acting);
        await sleep(STEP_MS);
        if (gen !== this.gen) return false;
        this.setState(then);
        return true;
    }

    async runFrom(gen, acting) {
        if (!(await this.acting(gen, acting, "Execute"))) return;
        this.workingSince = Date.now();
        await sleep(this.leftMs);
        if (gen !== this.gen) return;
        this.workingSince = null;
        let sum = 0;
        for (const v of this.params.values()) sum += v;
        this.write("result", DataType.Double, Number(this.read("setpoint")) + sum);
        await this.acting(gen, "Completing", "Complete");
    }

    stopReason(text) {
        const value = this.addressSpace.constructExtensionObject(this.alarmType,
            { ID: 1, value: 1, message: text });
        this.write("stopReason", DataType.ExtensionObject, value);
    }
}

// A method callback whose refusal is a status the client sees (a throw would reach it as
// BadInternalError); two parameters, the form node-opcua takes as async.
function guarded(fn) {
    return async function (inputArguments, _context) {
        try {
            fn(...inputArguments.map((v) => v.value));
            return { statusCode: StatusCodes.Good, outputArguments: [] };
        } catch (e) {
            if (e instanceof NotNow) return { statusCode: StatusCodes.BadInvalidState };
            throw e;
        }
    };
}

function addUnit(addressSpace, ns, packml, name) {
    const u = new Unit(name, addressSpace);
    const type = addressSpace.findObjectType("PackMLBaseObjectType", packml.index);
    const obj = type.instantiate({
        browseName: { name, namespaceIndex: ns.index },
        nodeId: `ns=${ns.index};s=${name}`,
        organizedBy: addressSpace.rootFolder.objects,
        namespace: ns,
    });
    const sm = obj.getComponentByName("BaseStateMachine", packml.index);
    u.nodes.state = sm.getComponentByName("CurrentState", 0);
    u.setState("Idle");
    const descriptor = addressSpace.findDataType("PackMLDescriptorDataType", packml.index);
    for (const [parent, method, fn] of [
        [sm, "Start", () => u.start()], [sm, "Stop", () => u.stop()],
        [sm, "Abort", () => u.abort()], [sm, "Hold", () => u.hold()],
        [sm, "Unhold", () => u.unhold()], [sm, "Reset", () => u.reset()],
        [sm, "Clear", () => u.clear()], [obj, "SetParameter", (d) => u.setParameter(d)]]) {
        // linked where the type made it, added where the type leaves it optional (the
        // state machine's commands)
        let node = parent.getMethodByName(method, packml.index);
        if (!node) {
            const args = method === "Start"
                ? [{ name: "Parameter", dataType: descriptor.nodeId, valueRank: -1 }] : [];
            node = ns.addMethod(parent, {
                nodeId: `ns=${ns.index};s=${name}.${method}`,
                browseName: { name: method, namespaceIndex: packml.index },
                inputArguments: args,
                outputArguments: [],
            });
        }
        node.bindMethod(guarded(fn));
    }
    const admin = obj.getComponentByName("Admin", packml.index);
    u.alarmType = addressSpace.findDataType("PackMLAlarmDataType", packml.index);
    u.nodes.stopReason = ns.addVariable({
        componentOf: admin,
        nodeId: `ns=${ns.index};s=${name}.Admin.StopReason`,
        browseName: { name: "StopReason", namespaceIndex: packml.index },
        dataType: u.alarmType.nodeId,
        value: { dataType: DataType.ExtensionObject, value: null },
    });
    for (const [key, variable, dataType, value, writable] of [
        ["commandId", "CommandId", DataType.String, "", true],
        ["setpoint", "Setpoint", DataType.Double, 0.0, true],
        ["result", "Result", DataType.Double, 0.0, false],
        ["starts", "Starts", DataType.UInt32, 0, false],
        ["fault", "Fault", DataType.Boolean, false, true]]) {
        const access = writable ? "CurrentRead | CurrentWrite" : "CurrentRead";
        u.nodes[key] = ns.addVariable({
            componentOf: obj,
            nodeId: `ns=${ns.index};s=${name}.${variable}`,
            browseName: { name: variable, namespaceIndex: ns.index },
            dataType: DataType[dataType],
            accessLevel: access,
            userAccessLevel: access,
            value: new Variant({ dataType, value }),
        });
    }
    return u;
}

function addScale(addressSpace, ns) {
    const obj = ns.addObject({
        nodeId: `ns=${ns.index};s=Scale1`,
        browseName: { name: "Scale1", namespaceIndex: ns.index },
        organizedBy: addressSpace.rootFolder.objects,
    });
    const weigh = ns.addMethod(obj, {
        nodeId: `ns=${ns.index};s=Scale1.Weigh`,
        browseName: { name: "Weigh", namespaceIndex: ns.index },
        inputArguments: [
            { name: "Tare", dataType: DataType.Double, valueRank: -1 },
            { name: "Count", dataType: DataType.UInt16, valueRank: -1 }],
        outputArguments: [{ name: "Net", dataType: DataType.Double, valueRank: -1 }],
    });
    weigh.bindMethod(async (inputArguments, _context) => {
        const [tare, count] = inputArguments.map((v) => v.value);
        if (count === 0) return { statusCode: StatusCodes.BadOutOfRange };
        return {
            statusCode: StatusCodes.Good,
            outputArguments: [{ dataType: DataType.Double, value: 10 * count - tare }],
        };
    });
}

async function main() {
    const serverCertificateManager = opts.pki
        ? new OPCUACertificateManager({ rootFolder: opts.pki,
                                        automaticallyAcceptUnknownCertificate: true })
        : undefined;
    const [userName, password] = (opts.user || ":").split(":");
    const security = opts.secure ? {
        securityPolicies: [SecurityPolicy.Basic256Sha256],
        securityModes: [MessageSecurityMode.SignAndEncrypt],
        allowAnonymous: false,
        certificateFile: opts.cert,
        privateKeyFile: opts.key,
        serverInfo: { applicationUri: opts.uri },
        userManager: { isValidUser: (u, p) => u === userName && p === password },
    } : {
        securityPolicies: [SecurityPolicy.None],
        securityModes: [MessageSecurityMode.None],
        allowAnonymous: true,
    };
    const server = new OPCUAServer({
        port,
        hostname: "127.0.0.1",
        host: "127.0.0.1",
        resourcePath: "/units/",
        nodesets: [nodesets.standard, NODESET],
        ...security,
        isAuditing: false,
        serverCertificateManager,
        buildInfo: { productName: "sfc-fast example PackML units (node-opcua)" },
    });
    await server.initialize();
    const addressSpace = server.engine.addressSpace;
    const ns = addressSpace.registerNamespace(URI);
    const packml = addressSpace.getNamespace(PACKML_URI);
    const units = names.map((name) => addUnit(addressSpace, ns, packml, name));
    addScale(addressSpace, ns);
    await server.start();
    console.log(`PackML units ${names.join(", ")} on opc.tcp://127.0.0.1:${port}/units/`);

    let stopping = false;
    const shutdown = async () => {
        if (stopping) return;
        stopping = true;
        for (const u of units) u.cancelWork();
        await server.shutdown(0);
        process.exit(0);
    };
    process.on("SIGTERM", shutdown);
    process.on("SIGINT", shutdown);
}

main().catch((e) => {
    console.error(`packml_unit: ${e.stack || e}`);
    process.exit(1);
});
