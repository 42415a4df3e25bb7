// JUnit 4 tests of Palisade.kt, run by Palisade's CI (tests/api/clients.rs), which passes
// the Rust client's backoff schedule in the system property `palisade.backoff.cases`.
package palisade.client

import java.io.File
import java.util.concurrent.TimeUnit
import okhttp3.Call
import okhttp3.Connection
import okhttp3.Interceptor
import okhttp3.MediaType
import okhttp3.Protocol
import okhttp3.Request
import okhttp3.Response
import okhttp3.ResponseBody
import org.junit.Assert.assertEquals
import org.junit.Assert.assertFalse
import org.junit.Assert.assertTrue
import org.junit.Test

/** A chain answering from a script of (status, Retry-After, body) and recording calls. */
class ScriptedChain(private val request: Request, answers: List<Triple<Int, String?, String>>) : Interceptor.Chain {
    private val script = ArrayDeque(answers)
    var calls = 0

    override fun request(): Request = request

    override fun proceed(request: Request): Response {
        calls += 1
        val (code, retryAfter, body) = script.removeFirst()
        val builder = Response.Builder()
            .request(request)
            .protocol(Protocol.HTTP_1_1)
            .code(code)
            .message("status $code")
            .body(ResponseBody.create(MediaType.get("application/json"), body))
        if (retryAfter != null) builder.header("Retry-After", retryAfter)
        return builder.build()
    }

    override fun connection(): Connection? = null
    override fun call(): Call = throw UnsupportedOperationException()
    override fun connectTimeoutMillis(): Int = 0
    override fun withConnectTimeout(timeout: Int, unit: TimeUnit): Interceptor.Chain = this
    override fun readTimeoutMillis(): Int = 0
    override fun withReadTimeout(timeout: Int, unit: TimeUnit): Interceptor.Chain = this
    override fun writeTimeoutMillis(): Int = 0
    override fun withWriteTimeout(timeout: Int, unit: TimeUnit): Interceptor.Chain = this
}

private class ArrayDeque<T>(items: List<T>) {
    private val list = ArrayList(items)
    fun removeFirst(): T = list.removeAt(0)
}

private const val LIMITED = """{"error":{"code":"RATE_LIMITED","message":"Too many requests","details":{"retry_after_ms":1800,"reason":"account_rate"}}}"""

class PalisadeTest {
    private var now = 1_000_000L
    private val slept = ArrayList<Long>()

    private fun interceptor(tooFast: TooFast, draw: Double = 0.5) = CooperativeInterceptor(
        policy = RetryPolicy(),
        tooFast = tooFast,
        clock = { now },
        sleep = { slept.add(it); now += it },
        random = { draw }
    )

    private fun get(): Request = Request.Builder().url("http://palisade.test/v1/items").get().build()

    private fun post(): Request = Request.Builder().url("http://palisade.test/v1/orders")
        .post(okhttp3.RequestBody.create(MediaType.get("application/json"), "{}")).build()

    @Test
    fun a429IsNeverRetriedBeforeItsRetryAfterAndSetsTooFast() {
        val tooFast = TooFast { now }
        val chain = ScriptedChain(get(), listOf(Triple(429, "2", LIMITED), Triple(200, null, "{}")))
        val response = interceptor(tooFast, draw = 0.5).intercept(chain)
        assertEquals(200, response.code())
        assertEquals(2, chain.calls)
        // retry_after_ms (1800, not Retry-After's rounded 2 s) + half of attempt 0's 100 ms.
        assertEquals(listOf(1_850L), slept)
        assertFalse("the wait is over", tooFast.isTooFast())
    }

    @Test
    fun aPostIsNotRetriedButTheAppKnowsItIsTooFast() {
        val tooFast = TooFast { now }
        val chain = ScriptedChain(post(), listOf(Triple(429, "2", LIMITED)))
        val response = interceptor(tooFast).intercept(chain)
        assertEquals(429, response.code())
        assertEquals(1, chain.calls)
        assertTrue(tooFast.isTooFast())
        assertEquals(1_800L, tooFast.remainingMs())
    }

    @Test
    fun unavailableIsRetriedWithGrowingBackoffThenGivenUp() {
        val chain = ScriptedChain(
            get(),
            listOf(Triple(503, null, "{}"), Triple(503, null, "{}"), Triple(503, null, "{}"))
        )
        val response = interceptor(TooFast { now }, draw = 0.99).intercept(chain)
        assertEquals(503, response.code())
        assertEquals(3, chain.calls)
        assertEquals(listOf(99L, 198L), slept)
    }

    @Test
    fun retryAfterIsReadFromTheBodyThenTheHeader() {
        assertEquals(1_800L, retryAfterMs("2", LIMITED))
        assertEquals(3_000L, retryAfterMs("3", "not json"))
        assertEquals(0L, retryAfterMs(null, null))
    }

    @Test
    fun reTapsAreIgnoredFor500msAndWhileInFlight() {
        val taps = TapDebouncer(clock = { now })
        assertTrue(taps.tryTap())
        now += 600
        assertFalse("in flight", taps.tryTap())
        taps.done()
        assertTrue(taps.tryTap())
        taps.done()
        now += 499
        assertFalse("within 500 ms", taps.tryTap())
        now += 1
        assertTrue(taps.tryTap())
    }

    @Test
    fun eventsAreSentInBatches() {
        val sent = ArrayList<List<Int>>()
        val batcher = EventBatcher<Int>(maxSize = 3, maxDelayMs = 1_000, clock = { now }) { sent.add(it) }
        (1..7).forEach { batcher.add(it) }
        assertEquals(listOf(listOf(1, 2, 3), listOf(4, 5, 6)), sent)
        batcher.tick()
        assertEquals(2, sent.size)
        now += 1_000
        batcher.tick()
        assertEquals(listOf(7), sent.last())
    }

    /** The same schedule as Palisade's Rust client, case by case (attempt, draw, wait ms). */
    @Test
    fun theBackoffScheduleIsTheRustClients() {
        val path = System.getProperty("palisade.backoff.cases")
            ?: error("run by tests/api/clients.rs, which passes palisade.backoff.cases")
        val policy = RetryPolicy()
        var checked = 0
        File(path).forEachLine { line ->
            val (attempt, unit, expected) = line.split(' ')
            assertEquals(line, expected.toLong(), policy.fullJitterMs(attempt.toInt(), unit.toDouble()))
            checked += 1
        }
        assertTrue(checked > 1000)
    }
}
