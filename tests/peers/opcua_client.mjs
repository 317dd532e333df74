// An OPC UA MES client on node-opcua, a stack independent of asyncua and of the host's own
// server, for tests/opcua/test_opcua_node.py: the scenario of tests/opcua/test_opcua.py
// with another stack.
//
//   node opcua_client.mjs ENDPOINT SCOPE JOB [TIMEOUT_S]
//
// Environment (all optional but for the PKI folder under security):
//   OPCUA_SECURITY   None (the default), Sign or SignAndEncrypt: Basic256Sha256 for the
//                    latter two
//   OPCUA_USER, OPCUA_PASSWORD
//                    a user-name session instead of an anonymous one
//   OPCUA_CLIENT_PKI the client's certificate store: its own certificate (made on first
//                    use) and the servers' it accepted; a server's certificate is accepted
//                    unseen (the tests' server is the one they started). Required for
//                    security; for None, node-opcua still makes a store, by default under
//                    the user's config folder.
//
// Connects; browses Objects → Scopes → SCOPE (namespace urn:sfc-fast:opcua) and finds its
// ISA95JobOrderReceiverObjectType and ISA95JobResponseProviderObjectType children by type
// definition; subscribes to the provider's SfcJobOrderStatusEventType events; Stores JOB
// (an ISA95JobOrderDataType made from the server's data type) and Starts it; waits for its
// Ended_Completed event; asks for its job response, and for one of an unknown id. Prints
// one JSON line of what it saw and exits 0, or prints the error (stderr) and exits 1 (a
// refused connection or session included).

import {
    AttributeIds,
    BrowseDirection,
    ClientMonitoredItem,
    DataType,
    MessageSecurityMode,
    NodeClassMask,
    OPCUACertificateManager,
    OPCUAClient,
    SecurityPolicy,
    StatusCodes,
    TimestampsToReturn,
    UserTokenType,
    VariantArrayType,
    coerceNodeId,
    constructEventFilter,
    ofType,
} from "node-opcua";

const JC_URI = "http://opcfoundation.org/UA/ISA95-JOBCONTROL_V2/";
const OWN_URI = "urn:sfc-fast:opcua";
const RECEIVER_TYPE = 1002;         // ISA95JobOrderReceiverObjectType
const PROVIDER_TYPE = 1003;         // ISA95JobResponseProviderObjectType
const JOB_ORDER_DATA_TYPE = 3008;   // ISA95JobOrderDataType
const WM = "WM-AXLE-FIT";
const EQUIPMENT = "STATION-10";
const UNKNOWN_JOB = "no-such-job-order";

const [endpoint, scope, job, timeoutArg] = process.argv.slice(2);
if (!endpoint || !scope || !job) {
    console.error("usage: node opcua_client.mjs ENDPOINT SCOPE JOB [TIMEOUT_S]");
    process.exit(2);
}
const timeoutMs = 1000 * Number(timeoutArg || 30);
const security = process.env.OPCUA_SECURITY || "None";
const MODES = { None: MessageSecurityMode.None, Sign: MessageSecurityMode.Sign,
                SignAndEncrypt: MessageSecurityMode.SignAndEncrypt };
if (!(security in MODES)) {
    console.error(`OPCUA_SECURITY: ${security}? (None, Sign or SignAndEncrypt)`);
    process.exit(2);
}
const pki = process.env.OPCUA_CLIENT_PKI;
if (security !== "None" && !pki) {
    // else node-opcua would make and trust certificates outside the caller's folder
    console.error("OPCUA_CLIENT_PKI is required with OPCUA_SECURITY");
    process.exit(2);
}
const user = process.env.OPCUA_USER;

function fail(message) {
    console.error(`opcua_client: ${message}`);
    process.exit(1);
}

// the whole scenario is bounded: a hung server fails the run, never the caller's timeout
const watchdog = setTimeout(() => fail(`not done after ${timeoutMs / 1000} s`), timeoutMs);

const stateName = (states) => (states || []).map((s) => s.stateText.text).join("_");

// an Int64 or UInt64 comes as [high, low] 32-bit words (high signed for an Int64)
function uint64(variant) {
    const v = variant.value;
    return Array.isArray(v) ? v[0] * 2 ** 32 + v[1] : Number(v);
}

function plain(variant) {
    if (!variant) return null;
    const wide = variant.dataType === DataType.Int64 || variant.dataType === DataType.UInt64;
    return wide && variant.arrayType === VariantArrayType.Scalar ? uint64(variant)
        : variant.value;
}

function outcome(result) {
    const last = result.outputArguments[result.outputArguments.length - 1];
    return {
        status: result.statusCode.name,
        returnStatus: last ? uint64(last) : null,
        returnStatusType: last ? DataType[last.dataType] : null,
    };
}

async function children(session, nodeId) {
    const result = await session.browse({
        nodeId,
        browseDirection: BrowseDirection.Forward,
        referenceTypeId: "HierarchicalReferences",
        includeSubtypes: true,
        nodeClassMask: NodeClassMask.Object | NodeClassMask.Variable | NodeClassMask.Method,
        resultMask: 63,
    });
    if (result.statusCode !== StatusCodes.Good) {
        throw new Error(`browse ${nodeId.toString()}: ${result.statusCode.toString()}`);
    }
    return result.references || [];
}

async function child(session, nodeId, ns, name) {
    const found = (await children(session, nodeId)).find(
        (r) => r.browseName.namespaceIndex === ns && r.browseName.name === name);
    if (!found) {
        throw new Error(`${nodeId.toString()} has no child ${ns}:${name}`);
    }
    return found;
}

// resolves when pred() holds, checked on every event
function waitFor(pred, what, ms, events) {
    return new Promise((resolve, reject) => {
        if (pred()) return resolve();
        const timer = setTimeout(() => reject(new Error(
            `${what}: not seen within ${ms / 1000} s (events: ${JSON.stringify(events)})`)), ms);
        const check = () => {
            if (pred()) {
                clearTimeout(timer);
                resolve();
            } else {
                waiters.add(check);
            }
        };
        waiters.add(check);
    });
}
const waiters = new Set();
function wake() {
    const pending = [...waiters];
    waiters.clear();
    for (const w of pending) w();
}

async function main() {
    const clientCertificateManager = pki ? new OPCUACertificateManager({
        rootFolder: pki, automaticallyAcceptUnknownCertificate: true }) : undefined;
    const client = OPCUAClient.create({
        clientCertificateManager,
        applicationName: "sfc-fast node-opcua test client",
        endpointMustExist: false,
        securityMode: MODES[security],
        securityPolicy: security === "None" ? SecurityPolicy.None
            : SecurityPolicy.Basic256Sha256,
        // a refused channel fails the run at once: retrying would only hide why
        connectionStrategy: { maxRetry: security === "None" ? 2 : 0, initialDelay: 200,
                              maxDelay: 1000 },
        keepSessionAlive: false,
    });
    await client.connect(endpoint);
    let session;
    try {
        session = await client.createSession(user === undefined ? undefined : {
            type: UserTokenType.UserName, userName: user,
            password: process.env.OPCUA_PASSWORD || "" });
    } catch (e) {
        await client.disconnect().catch(() => {});
        throw e;
    }
    try {
        return await scenario(session);
    } finally {
        await session.close().catch(() => {});
        await client.disconnect().catch(() => {});
    }
}

async function scenario(session) {
    const namespaces = await session.readNamespaceArray();
    const jc = namespaces.indexOf(JC_URI);
    const own = namespaces.indexOf(OWN_URI);
    if (jc < 0 || own < 0) {
        throw new Error(`namespaces missing: ${JSON.stringify(namespaces)}`);
    }

    // Objects → Scopes → {scope} → the receiver and the provider, by type definition
    const scopes = await child(session, coerceNodeId("i=85"), own, "Scopes");
    const folder = await child(session, scopes.nodeId, own, scope);
    let receiver = null;
    let provider = null;
    for (const r of await children(session, folder.nodeId)) {
        const kind = r.typeDefinition;
        if (kind.namespace === jc && kind.value === RECEIVER_TYPE) receiver = r;
        if (kind.namespace === jc && kind.value === PROVIDER_TYPE) provider = r;
    }
    if (!receiver || !provider) {
        throw new Error(`${scope}: no receiver or provider among its children`);
    }
    const methods = {};
    for (const obj of [receiver, provider]) {
        for (const r of await children(session, obj.nodeId)) {
            if (r.browseName.namespaceIndex === jc) {
                methods[r.browseName.name] = { objectId: obj.nodeId, methodId: r.nodeId };
            }
        }
    }
    for (const name of ["Store", "Start", "RequestJobResponseByJobOrderID"]) {
        if (!methods[name]) throw new Error(`method ${name} not found`);
    }
    const call = async (name, inputArguments) => {
        const result = await session.call({ ...methods[name], inputArguments });
        if (result.statusCode.isNotGood() && result.statusCode.name !== "Uncertain") {
            throw new Error(`${name}: ${result.statusCode.toString()}`);
        }
        return result;
    };

    // the provider's status events, their structures decoded
    const subscription = await session.createSubscription2({
        requestedPublishingInterval: 50,
        requestedLifetimeCount: 600,
        requestedMaxKeepAliveCount: 20,
        maxNotificationsPerPublish: 0,
        publishingEnabled: true,
        priority: 1,
    });
    const eventType = coerceNodeId(`ns=${own};s=SfcJobOrderStatusEventType`);
    const fields = ["EventType", "Message", `${jc}:JobOrder`, `${jc}:JobState`,
                    `${jc}:JobResponse`];
    const events = [];       // what each event of our job said
    const problems = [];
    const item = ClientMonitoredItem.create(
        subscription,
        { nodeId: provider.nodeId, attributeId: AttributeIds.EventNotifier },
        { queueSize: 1000, discardOldest: false, samplingInterval: 0,
          filter: constructEventFilter(fields, ofType(eventType)) },
        TimestampsToReturn.Neither);
    item.on("changed", (values) => {
        const [type, message, order, state, response] = values.map((v) => v.value);
        if (!order || !response || !Array.isArray(state)
                || order.constructor.name === "OpaqueStructure"
                || response.constructor.name === "OpaqueStructure"
                || !("jobOrderID" in order) || !("jobOrderID" in response)) {
            problems.push(`an event's structures are not decoded: ${JSON.stringify(values)}`);
            wake();
            return;
        }
        if (order.jobOrderID === job) {
            events.push({
                eventType: type ? type.toString() : null,
                message: message ? message.text : null,
                jobOrderID: order.jobOrderID,
                workMasterID: (order.workMasterID || []).map((w) => w.ID),
                state: stateName(state),
                responseJobOrderID: response.jobOrderID,
                responseState: stateName(response.jobState),
            });
        }
        wake();
    });
    await new Promise((resolve, reject) => {
        item.once("initialized", resolve);
        item.once("err", (e) => reject(new Error(`event subscription: ${e}`)));
    });

    // Store, then Start
    const order = await session.constructExtensionObject(
        coerceNodeId(`ns=${jc};i=${JOB_ORDER_DATA_TYPE}`), {
            jobOrderID: job,
            workMasterID: [{ ID: WM }],
            equipmentRequirements: [{ ID: EQUIPMENT }],
        });
    const noComment = { dataType: DataType.LocalizedText, arrayType: VariantArrayType.Array,
                        value: [] };
    const store = outcome(await call("Store", [
        { dataType: DataType.ExtensionObject, value: order }, noComment]));
    const start = outcome(await call("Start", [
        { dataType: DataType.String, value: job }, noComment]));

    const ended = () => problems.length > 0
        || events.some((e) => e.state.startsWith("Ended") || e.state.startsWith("Aborted"));
    await waitFor(ended, `${job}'s end`, Math.max(timeoutMs - 5000, 1000), events);
    if (problems.length) throw new Error(problems.join("; "));

    // the job response, and the one of an unknown id
    const r = await call("RequestJobResponseByJobOrderID", [
        { dataType: DataType.String, value: job }]);
    const body = r.outputArguments[0].value;
    if (!body || !("jobOrderID" in body)) {
        throw new Error(`the job response is not decoded: ${JSON.stringify(r.toJSON())}`);
    }
    const response = {
        ...outcome(r),
        jobOrderID: body.jobOrderID,
        jobResponseID: body.jobResponseID,
        state: stateName(body.jobState),
        equipmentActuals: (body.equipmentActuals || []).map((e) => e.ID),
        data: (body.jobResponseData || []).map((d) => ({
            ID: d.ID, value: plain(d.value), type: d.value ? DataType[d.value.dataType] : null })),
    };
    const u = await call("RequestJobResponseByJobOrderID", [
        { dataType: DataType.String, value: UNKNOWN_JOB }]);
    const unknown = { ...outcome(u), jobResponse: u.outputArguments[0].value ?? null };

    await subscription.terminate().catch(() => {});
    return {
        stack: "node-opcua",
        namespaces: { jc, own },
        receiver: receiver.nodeId.toString(),
        provider: provider.nodeId.toString(),
        store,
        start,
        states: events.map((e) => e.state),
        events,
        response,
        unknown,
    };
}

try {
    const seen = await main();
    clearTimeout(watchdog);
    console.log(JSON.stringify(seen));
    process.exit(0);
} catch (e) {
    fail(e && e.stack ? e.stack : String(e));
}
