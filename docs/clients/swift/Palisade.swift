// A cooperative iOS client for APIs behind Palisade (URLSession, async/await).
//
// The same rules and schedule as docs/clients/kotlin/Palisade.kt, which Palisade's CI
// compiles and tests; this file is not compiled there (Debian ships no Swift toolchain).
//
// - PalisadeSession.data(for:): never retries a 429 before the server's retry_after_ms (or
//   Retry-After), adds full-jitter exponential backoff, retries only idempotent requests,
//   and reports the "too fast" state.
// - TapDebouncer: no re-taps for 500 ms after a tap that sent a request, nor while it runs.
// - EventBatcher: analytics events sent in batches, not one request each.
import Foundation

/// Full-jitter exponential backoff: attempt n waits up to min(cap, base * 2^n).
public struct RetryPolicy {
    public var maxAttempts = 3
    public var baseMs: UInt64 = 100
    public var capMs: UInt64 = 2_000
    public var maxWaitMs: UInt64 = 5_000

    public init() {}

    public func ceilingMs(attempt: Int) -> UInt64 {
        let shift = UInt64(min(max(attempt, 0), 30))
        let (grown, overflow) = baseMs.multipliedReportingOverflow(by: 1 << shift)
        return min(overflow ? UInt64.max : grown, capMs)
    }

    /// A uniform wait in [0, ceilingMs(attempt)]; `unit` is a uniform draw in [0, 1).
    public func fullJitterMs(attempt: Int, unit: Double) -> UInt64 {
        UInt64(Double(ceilingMs(attempt: attempt)) * min(max(unit, 0), 1))
    }
}

/// How long the server asked to wait: details.retry_after_ms, else Retry-After, else 0.
public func retryAfterMs(retryAfterHeader: String?, body: Data?) -> UInt64 {
    if let body,
       let json = try? JSONSerialization.jsonObject(with: body) as? [String: Any],
       let error = json["error"] as? [String: Any],
       let details = error["details"] as? [String: Any],
       let ms = details["retry_after_ms"] as? NSNumber {
        return ms.uint64Value
    }
    if let header = retryAfterHeader?.trimmingCharacters(in: .whitespaces), let seconds = UInt64(header) {
        return seconds * 1_000
    }
    return 0
}

/// The app's "too fast" state: set on a 429 until the server's retry time.
@MainActor
public final class TooFast: ObservableObject {
    @Published public private(set) var until: Date = .distantPast
    public var isTooFast: Bool { Date() < until }

    func block(until: Date) {
        if until > self.until { self.until = until }
    }
}

public struct PalisadeSession {
    public var session: URLSession = .shared
    public var policy = RetryPolicy()
    public var tooFast: TooFast

    public init(tooFast: TooFast) {
        self.tooFast = tooFast
    }

    /// Like `URLSession.data(for:)`, retrying 429, 502, 503 and 504 answers to idempotent
    /// requests after retry_after + full jitter, within `policy.maxWaitMs`.
    public func data(for request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        let idempotent = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"].contains(request.httpMethod ?? "GET")
            || request.value(forHTTPHeaderField: "Idempotency-Key") != nil
        var attempt = 0
        var waited: UInt64 = 0
        while true {
            let (data, response) = try await session.data(for: request)
            guard let http = response as? HTTPURLResponse else { throw URLError(.badServerResponse) }
            let status = http.statusCode
            guard status == 429 || (502...504).contains(status) else { return (data, http) }
            let floor = retryAfterMs(retryAfterHeader: http.value(forHTTPHeaderField: "Retry-After"), body: data)
            if status == 429 {
                let until = Date().addingTimeInterval(Double(floor) / 1_000)
                await MainActor.run { tooFast.block(until: until) }
            }
            if !idempotent || attempt + 1 >= policy.maxAttempts { return (data, http) }
            let wait = floor + policy.fullJitterMs(attempt: attempt, unit: Double.random(in: 0..<1))
            if waited + wait > policy.maxWaitMs { return (data, http) }
            try await Task.sleep(nanoseconds: wait * 1_000_000)
            waited += wait
            attempt += 1
        }
    }
}

/// No re-taps for `window` after a tap that sent a request, nor while it is in flight.
@MainActor
public final class TapDebouncer {
    private let window: TimeInterval
    private var lastTap: Date = .distantPast
    private var inFlight = false

    public init(window: TimeInterval = 0.5) {
        self.window = window
    }

    /// True when this tap may send its request (then call `done()` when it finishes).
    public func tryTap(now: Date = Date()) -> Bool {
        if inFlight || now.timeIntervalSince(lastTap) < window { return false }
        lastTap = now
        inFlight = true
        return true
    }

    public func done() {
        inFlight = false
    }
}

/// Collects events and sends them `maxSize` at a time, or after `maxDelay`.
public actor EventBatcher<Event> {
    private let maxSize: Int
    private let maxDelay: TimeInterval
    private let send: ([Event]) async -> Void
    private var pending: [Event] = []
    private var firstAt = Date()

    public init(maxSize: Int = 100, maxDelay: TimeInterval = 10, send: @escaping ([Event]) async -> Void) {
        self.maxSize = maxSize
        self.maxDelay = maxDelay
        self.send = send
    }

    public func add(_ event: Event) async {
        if pending.isEmpty { firstAt = Date() }
        pending.append(event)
        if pending.count >= maxSize { await flush() }
    }

    /// Call periodically (and when the app goes to the background).
    public func tick() async {
        if !pending.isEmpty && Date().timeIntervalSince(firstAt) >= maxDelay { await flush() }
    }

    public func flush() async {
        guard !pending.isEmpty else { return }
        let batch = pending
        pending = []
        await send(batch)
    }
}
