// A cooperative Android/JVM client for APIs behind Palisade (OkHttp 3.x and 4.x).
//
// - CooperativeInterceptor: never retries a 429 before the server's retry_after_ms (or
//   Retry-After), adds full-jitter exponential backoff (the same schedule as Palisade's
//   Rust client), retries only idempotent requests, and reports the "too fast" state.
// - TapDebouncer: no re-taps for 500 ms after a tap that sent a request, nor while it runs.
// - EventBatcher: analytics events sent in batches, not one request each.
//
// Copy this file into your app (package name as you like). Tested in Palisade's CI with
// Debian's kotlinc, OkHttp and JUnit 4 (tests/api/clients.rs).
package palisade.client

import okhttp3.Interceptor
import okhttp3.Response

/** Full-jitter exponential backoff: attempt n waits up to min(cap, base * 2^n). */
class RetryPolicy(
    val maxAttempts: Int = 3,
    val baseMs: Long = 100,
    val capMs: Long = 2_000,
    val maxWaitMs: Long = 5_000
) {
    /** The largest wait before retry [attempt] (0-based), without the server's floor. */
    fun ceilingMs(attempt: Int): Long {
        val shift = attempt.coerceIn(0, 30)
        val grown = if (baseMs > (Long.MAX_VALUE shr shift)) Long.MAX_VALUE else baseMs shl shift
        return minOf(grown, capMs)
    }

    /** A uniform wait in [0, ceilingMs(attempt)]; [unit] is a uniform draw in [0, 1). */
    fun fullJitterMs(attempt: Int, unit: Double): Long =
        (ceilingMs(attempt) * unit.coerceIn(0.0, 1.0)).toLong()
}

/** How long the server asked to wait: details.retry_after_ms, else Retry-After, else 0. */
fun retryAfterMs(retryAfterHeader: String?, body: String?): Long {
    val fromBody = body?.let { Regex("\"retry_after_ms\"\\s*:\\s*(\\d+)").find(it) }
        ?.groupValues?.get(1)?.toLongOrNull()
    if (fromBody != null) return fromBody
    val seconds = retryAfterHeader?.trim()?.toLongOrNull() ?: return 0
    return seconds * 1_000
}

/** The app's "too fast" state: set on a 429 until the server's retry time. */
class TooFast(private val clock: () -> Long = System::currentTimeMillis) {
    @Volatile
    var untilMs: Long = 0
        private set

    fun blockUntil(untilMs: Long) {
        if (untilMs > this.untilMs) this.untilMs = untilMs
    }

    /** True while the app should show "too fast" (and grey out the action). */
    fun isTooFast(): Boolean = clock() < untilMs

    /** Milliseconds left, 0 when the app may go on. */
    fun remainingMs(): Long = maxOf(0, untilMs - clock())
}

/**
 * Retries 429, 502, 503 and 504 answers to idempotent requests (GET, HEAD, OPTIONS, PUT,
 * DELETE, or any with an Idempotency-Key) after retry_after + full jitter, within
 * [RetryPolicy.maxWaitMs]; every 429 sets [tooFast]. Other answers pass through.
 */
class CooperativeInterceptor(
    private val policy: RetryPolicy = RetryPolicy(),
    private val tooFast: TooFast = TooFast(),
    private val clock: () -> Long = System::currentTimeMillis,
    private val sleep: (Long) -> Unit = { Thread.sleep(it) },
    private val random: () -> Double = { Math.random() }
) : Interceptor {
    override fun intercept(chain: Interceptor.Chain): Response {
        val request = chain.request()
        val idempotent = request.method() in setOf("GET", "HEAD", "OPTIONS", "PUT", "DELETE") ||
            request.header("Idempotency-Key") != null
        var attempt = 0
        var waited = 0L
        while (true) {
            val response = chain.proceed(request)
            val code = response.code()
            if (code != 429 && code !in 502..504) return response
            val floor = retryAfterMs(response.header("Retry-After"), response.peekBody(16_384).string())
            if (code == 429) tooFast.blockUntil(clock() + floor)
            if (!idempotent || attempt + 1 >= policy.maxAttempts) return response
            val wait = floor + policy.fullJitterMs(attempt, random())
            if (waited + wait > policy.maxWaitMs) return response
            response.close()
            sleep(wait)
            waited += wait
            attempt += 1
        }
    }
}

/** No re-taps for [windowMs] after a tap that sent a request, nor while it is in flight. */
class TapDebouncer(
    private val windowMs: Long = 500,
    private val clock: () -> Long = System::currentTimeMillis
) {
    private var lastTapMs = Long.MIN_VALUE / 2
    private var inFlight = false

    /** True when this tap may send its request (then call [done] when it finishes). */
    @Synchronized
    fun tryTap(): Boolean {
        val now = clock()
        if (inFlight || now - lastTapMs < windowMs) return false
        lastTapMs = now
        inFlight = true
        return true
    }

    /** The request of the last accepted tap has finished. */
    @Synchronized
    fun done() {
        inFlight = false
    }
}

/** Collects events and sends them [maxSize] at a time, or after [maxDelayMs]. */
class EventBatcher<T>(
    private val maxSize: Int = 100,
    private val maxDelayMs: Long = 10_000,
    private val clock: () -> Long = System::currentTimeMillis,
    private val send: (List<T>) -> Unit
) {
    private val pending = ArrayList<T>()
    private var firstAtMs = 0L

    @Synchronized
    fun add(event: T) {
        if (pending.isEmpty()) firstAtMs = clock()
        pending.add(event)
        if (pending.size >= maxSize) flush()
    }

    /** Call periodically (and when the app goes to the background). */
    @Synchronized
    fun tick() {
        if (pending.isNotEmpty() && clock() - firstAtMs >= maxDelayMs) flush()
    }

    @Synchronized
    fun flush() {
        if (pending.isEmpty()) return
        val batch = ArrayList(pending)
        pending.clear()
        send(batch)
    }
}
