// Signs who nginx authenticated as X-Palisade-Identity (docs/GUIDE.md, "Signed identity"),
// for nginx's JavaScript module (njs 0.7+, Debian: libnginx-mod-http-js). The secret is read
// from the environment nginx passes (`env PALISADE_IDENTITY_SECRET;` in the main context);
// the user, device and tenant from $palisade_user, $palisade_device and $palisade_tenant, which
// the configuration sets from ITS OWN authentication. tests/api/nginx.rs runs this file in a real nginx.

import crypto from 'crypto';

function b64url(text) {
    return Buffer.from(text).toString('base64url');
}

// `v1.<exp>.<uid>.<did>.<sig>`, or `v2.<exp>.<uid>.<did>.<tid>.<sig>` when
// $palisade_tenant names the tenant (the partner or app) the gateway authenticated; valid for
// 60 s; "" when no secret is configured.
function identity(r) {
    const secret = process.env.PALISADE_IDENTITY_SECRET;
    if (!secret) {
        return '';
    }
    const uid = r.variables.palisade_user || '';
    const did = r.variables.palisade_device || '';
    const tid = r.variables.palisade_tenant || '';
    const exp = Math.floor(Date.now() / 1000) + 60;
    const payload = tid
        ? `v2.${exp}.${b64url(uid)}.${b64url(did)}.${b64url(tid)}`
        : `v1.${exp}.${b64url(uid)}.${b64url(did)}`;
    const sig = crypto.createHmac('sha256', secret).update(payload).digest('base64url');
    return `${payload}.${sig}`;
}

export default { identity };
