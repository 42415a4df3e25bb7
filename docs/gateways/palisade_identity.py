"""Signed identities for Palisade (`X-Palisade-Identity`), for an auth service or backend.

Sign after the caller is authenticated, and hand the header to the gateway in front of
Palisade: an Envoy ext_authz service returns it as a header to add (the route's rate limit
action `request_headers: {header_name: x-palisade-identity, descriptor_key: identity}`
passes it on), a backend calling `/v1/limit/check` puts it in the `identity` field.
Palisade's test suite verifies what this file signs (tests/api/trust).

    python3 palisade_identity.py SECRET UID [DID] [TTL] [TENANT]   # prints one identity
"""

import base64
import hashlib
import hmac
import sys
import time


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def identity(secret: bytes, uid: str = "", did: str = "", ttl: int = 60, now: float | None = None,
             tenant: str = "") -> str:
    """`v1.<exp>.<uid>.<did>.<sig>`, or `v2.<exp>.<uid>.<did>.<tid>.<sig>` with a tenant: valid
    until now + ttl (+ Palisade's 30 s skew)."""
    exp = int(time.time() if now is None else now) + ttl
    payload = f"v1.{exp}.{_b64(uid.encode())}.{_b64(did.encode())}"
    if tenant:
        payload = f"v2.{exp}.{_b64(uid.encode())}.{_b64(did.encode())}.{_b64(tenant.encode())}"
    signature = hmac.new(secret, payload.encode(), hashlib.sha256).digest()
    return f"{payload}.{_b64(signature)}"


class SignIdentity:
    """WSGI middleware: after `authenticate(environ)` names the caller (user id, device id,
    and optionally the tenant) or None, the request carries a fresh `X-Palisade-Identity` (any the client sent is
    dropped), for code further in that calls Palisade."""

    def __init__(self, app, secret: bytes, authenticate, ttl: int = 60):
        self.app, self.secret, self.authenticate, self.ttl = app, secret, authenticate, ttl

    def __call__(self, environ, start_response):
        environ.pop("HTTP_X_PALISADE_IDENTITY", None)
        caller = self.authenticate(environ)
        if caller is not None:
            uid, did, *tenant = caller
            environ["HTTP_X_PALISADE_IDENTITY"] = identity(
                self.secret, uid or "", did or "", self.ttl, tenant=(tenant[0] if tenant else "") or "")
        return self.app(environ, start_response)


if __name__ == "__main__":
    secret, uid = sys.argv[1].encode(), sys.argv[2]
    did = sys.argv[3] if len(sys.argv) > 3 else ""
    ttl = int(sys.argv[4]) if len(sys.argv) > 4 else 60
    tenant = sys.argv[5] if len(sys.argv) > 5 else ""
    print(identity(secret, uid, did, ttl, tenant=tenant))
