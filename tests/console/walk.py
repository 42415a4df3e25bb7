"""An analyst's walk through the console in a real headless Chromium (Debian's package,
driven by Playwright): sign in, read the login guard and the charts, find the accounts a
scripted attack locked, read why, release one where it is shown and the rest in bulk, see the
audit entry; then an unreachable API, a refused search and a phone. Run by
tests/api/console.rs against a seeded instance.

    python3 tests/console/walk.py BASE_URL ANALYST_TOKEN [SCREENSHOT_DIR]

Exits non-zero with the failed step on stderr.
"""

import os
import re
import sys

from playwright.sync_api import expect, sync_playwright

BASE, TOKEN = sys.argv[1], sys.argv[2]
SHOTS = sys.argv[3] if len(sys.argv) > 3 else None
CHROMIUM = os.environ.get("PALISADE_CHROMIUM", "/usr/bin/chromium")


def shot(page, name):
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, name + ".png"), full_page=True)


UTC_TIME = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC$")


def times_are_utc(page):
    """Every time on the page is written one way, with its zone."""
    texts = page.locator("time").all_inner_texts()
    bad = [t for t in texts if not UTC_TIME.match(t)]
    assert not bad, f"times not in the one format: {bad[:5]}"
    return len(texts)


def chart_card(page, name):
    return page.locator(f'.card.rate[data-class="{name}"]')


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "console",
            lambda m: errors.append(m.text) if m.type == "error" else None,
        )
        urls = []
        page.on("request", lambda r: urls.append(r.url))

        # Sign in: a wrong token is refused with a message, the analyst token gets in.
        page.goto(BASE + "/console")
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        shot(page, "signin")
        page.get_by_label("API token").fill("pal_not_a_token")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#status .error")).to_contain_text("Sign-in failed")
        errors.clear()  # the refused sign-in logs its 401 in the console
        page.get_by_label("API token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        expect(page.locator("#active-count")).to_have_text("5")
        # The login guard and the threshold in force.
        expect(page.locator("#guard-state")).to_have_text("off")
        expect(page.locator("#guard-threshold")).to_contain_text("failures from unknown contexts")
        expect(page.locator("#guard-threshold")).to_contain_text("of 100 ")
        expect(page.locator("#guard-logins")).to_contain_text("successful logins in the window")
        # The block-rate charts: the card's width, a count axis, a UTC time axis, a tooltip per
        # minute; a class without traffic says so instead of "0.0 % refused".
        auth = chart_card(page, "auth")
        expect(auth.locator("svg.chart")).to_be_visible()
        box = auth.locator("svg.chart").bounding_box()
        assert box["width"] >= 250, f"the chart is {box['width']}px wide"
        expect(auth.locator("svg.chart .point title")).to_have_count(60)
        expect(auth.locator("svg.chart text.time").last).to_contain_text("UTC")
        assert re.search(r"\d+ allowed, \d+ refused", auth.locator("svg.chart .point title").last.text_content())
        expect(page.locator(".card.rate .empty").first).to_have_text("No requests in this window.")
        expect(page.locator(".card.rate", has_text="0.0% refused")).to_have_count(0)
        assert times_are_utc(page) > 0
        shot(page, "overview")
        # The day window is the one highlighted, with 96 bars of 15 minutes.
        page.get_by_role("link", name="last day").click()
        expect(page.get_by_role("link", name="last day")).to_have_attribute("aria-current", "true")
        expect(chart_card(page, "auth").locator("svg.chart .point title")).to_have_count(96)
        day, hour = (
            page.get_by_role("link", name=n).evaluate("e => getComputedStyle(e).backgroundColor")
            for n in ("last day", "last hour")
        )
        assert day != hour, "the selected window is not highlighted"
        # The guard is turned off for a while, with a reason.
        page.get_by_text("Turn off for a while…").click()
        page.get_by_role("button", name="Turn off").click()
        expect(page.locator("#status .error")).to_have_text("Give a reason for turning the guard off.")
        page.get_by_label("Reason for turning the guard off").fill("mass password reset mailing")
        page.get_by_role("button", name="Turn off").click()
        expect(page.locator("#status .info")).to_contain_text("The login guard is off until")
        expect(page.locator("#guard-released")).to_contain_text("turned off by an analyst until")
        shot(page, "guard")

        # Lockouts from the attacking network.
        page.get_by_role("link", name="Lockouts", exact=True).click()
        expect(page.get_by_role("heading", name="Lockouts")).to_be_visible()
        page.get_by_label("IP or CIDR").fill("198.51.100.0/24")
        page.get_by_role("button", name="Search").click()
        rows = page.locator("tbody tr")
        expect(rows).to_have_count(3)
        assert times_are_utc(page) >= 6
        for account in ["victim-1", "victim-2", "victim-3"]:
            expect(page.get_by_role("link", name=account, exact=True)).to_be_visible()
        shot(page, "lockouts")

        # Why was victim-1 locked?
        page.get_by_role("link", name="victim-1", exact=True).click()
        expect(page.get_by_role("heading", name="Account victim-1")).to_be_visible()
        expect(page.get_by_text("account_failures, 10 failures").first).to_be_visible()
        expect(page.get_by_text("Failed login from 198.51.100.7").first).to_be_visible()
        expect(page.locator("text=locked").first).to_be_visible()
        refusal = page.locator("tbody tr", has_text="limited: account_locked")
        expect(refusal).to_contain_text("lockout")
        expect(refusal.locator("td").nth(2)).to_have_text("2")
        shot(page, "account")
        # A data-subject export is offered as a download, not shown in a URL.
        page.get_by_role("button", name="Export everything stored (data-subject request)").click()
        with page.expect_download() as download:
            page.get_by_role("link", name="Download the export (JSON)").click()
        path = download.value.path()
        with open(path, encoding="utf-8") as f:
            exported = __import__("json").load(f)
        assert exported["account"] == "victim-1" and len(exported["auth_events"]) == 10
        # Released where it is shown, with a reason.
        page.get_by_role("button", name="Release", exact=True).click()
        expect(page.locator("#status .error")).to_have_text("Give a reason for the release.")
        page.get_by_label("Reason for the release").fill("owner verified by phone")
        page.get_by_role("button", name="Release", exact=True).click()
        expect(page.locator("#status .info")).to_have_text("Released the lockout of victim-1.")
        expect(page.locator("main .badge.ok", has_text="not locked")).to_be_visible()

        # The lockout's end moves from its page.
        page.goto(BASE + "/console#/lockouts?account=victim-2&status=active")
        page.get_by_role("link", name="Details").click()
        expect(page.get_by_role("heading", name="Lockout of victim-2")).to_be_visible()
        # The header's count and the table agree; the failures after the lock are apart.
        expect(page.locator("main p").first).to_contain_text("10 failures")
        expect(page.locator("#caused")).to_have_text("The 10 failures that caused it")
        expect(page.locator("table").first.locator("tbody tr")).to_have_count(10)
        expect(page.locator("#while-locked")).to_have_text("3 more after it locked")
        expect(page.locator("table").nth(1).locator("tbody tr")).to_have_count(3)
        expect(page.get_by_role("button", name="Release", exact=True)).to_be_visible()
        shot(page, "lockout")
        page.get_by_label("Reason for the change").fill("incident review needs an hour")
        page.get_by_role("button", name="Extend or shorten").click()
        expect(page.locator("#status .info")).to_contain_text("The lockout now ends at")

        # The attacking IP's page: the accounts it went for.
        page.get_by_label("Account or IP").fill("198.51.100.7")
        page.get_by_role("button", name="Look up").click()
        expect(page.get_by_role("heading", name="IP 198.51.100.7")).to_be_visible()
        expect(page.get_by_role("link", name="victim-2", exact=True).first).to_be_visible()
        shot(page, "ip")
        # A network in the search box opens the network, not an account of that name.
        page.get_by_label("Account or IP").fill("198.51.100.0/24")
        page.get_by_role("button", name="Look up").click()
        expect(page.get_by_role("heading", name="Network 198.51.100.0/24")).to_be_visible()
        expect(page.get_by_role("link", name="victim-3", exact=True).first).to_be_visible()
        shot(page, "network")

        # Bulk release: preview first, then release.
        page.goto(BASE + "/console#/lockouts?ip=198.51.100.0%2F24&status=active")
        expect(page.locator("tbody tr")).to_have_count(2)
        page.get_by_role("button", name="Release all matching…").click()
        expect(page.locator("#status .error")).to_contain_text("Give a reason")
        page.locator("#release-reason").fill("incident 7: test network, verified")
        page.get_by_role("button", name="Release all matching…").click()
        expect(page.locator("#release-preview")).to_contain_text(
            "2 lockout(s) would be released"
        )
        # The preview answered: the old "give a reason" is gone.
        expect(page.locator("#status .error")).to_have_count(0)
        page.get_by_role("button", name="Release 2").click()
        expect(page.locator("#status .info")).to_contain_text("Released 2 lockouts")
        expect(page.get_by_text("No lockouts match.")).to_be_visible()

        # The audit entry says who and why.
        page.get_by_role("link", name="Audit log").click()
        expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
        entry = page.locator("tbody tr", has_text="lockout.bulk_release")
        expect(entry).to_have_count(1)
        expect(entry).to_contain_text("ana (analyst)")
        expect(entry).to_contain_text("incident 7: test network, verified")
        shot(page, "audit")

        # Overrides and the canary in force.
        page.get_by_role("link", name="Policy").click()
        expect(page.get_by_role("heading", name="Policy")).to_be_visible()
        override = page.locator("tbody tr", has_text="launch day")
        expect(override).to_have_count(1)
        expect(override.get_by_role("link", name="partner")).to_be_visible()
        expect(page.get_by_text("try 20 anonymous reads a minute", exact=False)).to_be_visible()
        shot(page, "policy")
        # An IPv6 client's /64 is a link like any address.
        page.get_by_role("link", name="ip:2001:db8:1::/64").click()
        expect(page.get_by_role("heading", name="Network 2001:db8:1::/64")).to_be_visible()

        # A messaging destination tightened for SMS pumping is lifted from the alerts.
        page.get_by_role("link", name="Alerts", exact=True).click()
        expect(page.locator("tbody tr", has_text="otp_conversion")).to_have_count(1)
        expect(page.get_by_role("heading", name="Messaging destinations tightened")).to_be_visible()
        page.get_by_role("button", name="Lift the tightening").click()
        expect(page.locator("#status .error")).to_have_text("Give a reason for lifting it.")
        page.get_by_label("Reason for lifting +44770").fill("carrier outage, confirmed")
        page.get_by_role("button", name="Lift the tightening").click()
        expect(page.locator("#status .info")).to_have_text(
            "Lifted messaging:otp_conversion on destination:+44770."
        )

        # A search the API refuses: the error, the form to correct it, no stale results.
        page.goto(BASE + "/console#/lockouts?status=all")
        expect(page.locator("tbody tr").first).to_be_visible()
        page.get_by_label("IP or CIDR").fill("not-an-address")
        page.get_by_role("button", name="Search").click()
        expect(page.locator("#status .error")).to_be_visible()
        expect(page.locator("tbody tr")).to_have_count(0)
        expect(page.get_by_label("IP or CIDR")).to_have_value("not-an-address")

        # Palisade unreachable: said in words, in view, and the old page is gone.
        page.goto(BASE + "/console#/audit")
        expect(page.locator("tbody tr").first).to_be_visible()
        page.route("**/v1/**", lambda route: route.abort())
        page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        page.evaluate("location.hash = '#/alerts'")
        banner = page.locator("#status .error")
        expect(banner).to_have_text(
            "Palisade unreachable: check that the service is running, then try again."
        )
        expect(banner).to_be_in_viewport()
        expect(page.get_by_role("heading", name="Alerts")).to_be_visible()
        expect(page.locator("main table")).to_have_count(0)
        shot(page, "unreachable")
        page.unroute("**/v1/**")
        errors.clear()  # the aborted requests are logged in the console

        # An account name written as markup is shown as text, never run.
        page.goto(BASE + "/console#/failing")
        expect(page.get_by_role("heading", name="Failing, not locked")).to_be_visible()
        page.goto(BASE + "/console#/lockouts")
        expect(page.get_by_text("<img src=x onerror=window.pwned=1>")).to_be_visible()
        assert page.evaluate("window.pwned") is None, "markup in an account name ran"

        # Keyboard: the skip link comes first.
        page.reload()
        expect(page.get_by_role("heading", name="Lockouts")).to_be_visible()
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.className") == "skip"

        # The token never travels in a URL and stays in this tab's session storage.
        assert not any(TOKEN in url for url in urls), "the token appeared in a URL"
        assert page.evaluate("sessionStorage.getItem('palisade.token')") == TOKEN
        assert page.evaluate("localStorage.length") == 0

        # Readable on a phone: before sign-in only the form; then a short header, and tables
        # as stacked cards with each value labelled.
        phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
        mobile = phone.new_page()
        mobile.goto(BASE + "/console")
        expect(mobile.locator("#nav")).to_be_hidden()
        expect(mobile.locator("#lookup")).to_be_hidden()
        mobile.get_by_label("API token").fill(TOKEN)
        mobile.get_by_role("button", name="Sign in").click()
        expect(mobile.get_by_role("heading", name="Overview")).to_be_visible()
        width = mobile.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the overview scrolls sideways on a phone ({width}px)"
        header = mobile.locator("header").bounding_box()["height"]
        assert header < 80, f"the header is {header}px high on a phone"
        shot(mobile, "phone")
        mobile.goto(BASE + "/console#/lockouts?status=all")
        cell = mobile.locator("tbody tr").first.locator("td").nth(1)
        expect(cell).to_be_visible()
        assert cell.evaluate("e => getComputedStyle(e).display") != "table-cell"
        assert cell.bounding_box()["width"] >= 300, "a card's line spans the card"
        label = cell.evaluate("e => getComputedStyle(e, '::before').content")
        assert label == '"Account"', label
        width = mobile.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the lockouts scroll sideways on a phone ({width}px)"
        shot(mobile, "phone-lockouts")
        mobile.goto(BASE + "/console#/account/victim-1")
        why = mobile.locator("tbody tr", has_text="account_locked").first.locator('td[data-label="Why"]')
        expect(why).to_contain_text("lockout")
        assert why.bounding_box()["width"] >= 300, "the Why column is squeezed on a phone"

        # Sign out forgets the token.
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        assert page.evaluate("sessionStorage.getItem('palisade.token')") is None

        assert not errors, f"errors in the page: {errors}"
        browser.close()
    print("console walk: ok")


if __name__ == "__main__":
    main()
