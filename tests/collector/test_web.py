"""The collector's web page over real sockets: the jobs list, a job's live report, paste a log
(plain, gzip, too large, kept only when asked), the token as a cookie, and a policy on every page."""

import asyncio
import gzip
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from firstfault.analysis.catalog import load_catalog
from firstfault.collector.api import Api
from firstfault.collector.store import open_store
from tests.analysis.shipped import ship_file

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "data" / "real" / "deepspeed-exception-rank2-of-4"
PASTED = ROOT / "tests" / "data" / "real" / "torchrun-pasted-exception-rank2-of-4" / "launcher.log"
JOB = "ds-77"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(str(tmp_path_factory.mktemp("web") / "ff.db"))
    records = []
    for p in sorted((REAL / "logs").glob("*.log")):
        records += ship_file(p, "node-a", int(p.stem.rsplit("rank", 1)[1]), len(records))
    s.insert([type(r)(**{**{f: getattr(r, f) for f in r.__slots__}, "job": JOB}) for r in records])
    return s


def serve(api: Api, client):
    """Run ``client(session, base_url)`` against the api served on a loopback port."""
    async def main():
        runner = web.AppRunner(api.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
                return await client(s, f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def _policy_ok(resp, connect="'none'"):
    csp = resp.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and f"connect-src {connect}" in csp and "frame-ancestors 'none'" in csp
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


def test_jobs_list_and_a_jobs_live_report(store):
    async def client(s, base):
        async with s.get(base + "/") as r:
            assert r.status == 200
            _policy_ok(r)
            page = await r.text()
        assert f"<a href='/jobs/{JOB}'>{JOB}</a>" in page and "rank 2 on node-a: python.exception" in page
        async with s.get(base + "/?q=no-such") as r:
            assert "No jobs match the filter." in await r.text()
        async with s.get(base + f"/jobs/{JOB}") as r:
            assert r.status == 200
            _policy_ok(r, "'self'")
            page = await r.text()
        assert "First failure: <span id='ff-who'>rank 2 on node-a</span>" in page and "data-live='1'" in page
        async with s.get(base + "/jobs/nope") as r:
            assert r.status == 404 and "no job &#x27;nope&#x27;" in await r.text()
    serve(Api(store, load_catalog()), client)


def _form(**fields) -> aiohttp.FormData:
    form = aiohttp.FormData()
    for k, v in fields.items():
        if isinstance(v, bytes):
            form.add_field(k, v, filename="log.gz", content_type="application/gzip")
        else:
            form.add_field(k, v)
    return form


def test_paste_a_log_plain_or_gzip_and_nothing_is_kept(store):
    log = PASTED.read_bytes()
    before = len(store.jobs())

    async def client(s, base):
        async with s.get(base + "/paste") as r:
            page = await r.text()
        assert "<label for='text'>" in page and "<label for='file'>" in page
        for form in (_form(text=log.decode()), _form(file=gzip.compress(log))):
            async with s.post(base + "/paste", data=form) as r:
                assert r.status == 200
                _policy_ok(r)
                assert "First failure: <span id='ff-who'>rank 2" in await r.text()
        async with s.post(base + "/paste", data=gzip.compress(log), headers={"Content-Type": "application/gzip"}) as r:
            assert r.status == 200 and "First failure: <span id='ff-who'>rank 2" in await r.text()
    serve(Api(store, load_catalog()), client)
    assert len(store.jobs()) == before


def test_a_paste_is_kept_only_when_asked(store):
    async def client(s, base):
        async with s.post(base + "/paste", data=_form(text=PASTED.read_text(), keep="1"), allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"].startswith("/jobs/paste-")
            job = r.headers["Location"].rsplit("/", 1)[1]
        async with s.get(base + r.headers["Location"]) as r:
            assert "First failure: <span id='ff-who'>rank 2" in await r.text()
        return job
    job = serve(Api(store, load_catalog()), client)
    assert store.job(job) is not None


def test_too_large_bad_gzip_and_another_sites_form_are_refused(store):
    async def client(s, base):
        async with s.post(base + "/paste", data=_form(text="x" * 5000)) as r:
            assert r.status == 413
        bomb = gzip.compress(b"y" * 100_000)  # small, inflates past the limit
        async with s.post(base + "/paste", data=_form(file=bomb)) as r:
            assert r.status == 413
        async with s.post(base + "/paste", data=_form(file=b"\x1f\x8bnot gzip")) as r:
            assert r.status == 400 and "not a readable gzip file" in await r.text()
        async with s.post(base + "/paste", data=_form(text="x"), headers={"Origin": "http://evil.invalid"}) as r:
            assert r.status == 403
    serve(Api(store, load_catalog(), max_paste=4096), client)


def test_off_loopback_the_token_is_asked_for_and_kept_as_a_cookie(store):
    async def client(s, base):
        async with s.get(base + "/", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/login"
        async with s.get(base + "/api/jobs") as r:
            assert r.status == 401
        async with s.post(base + "/login", data={"token": "wrong"}, allow_redirects=False) as r:
            assert r.status == 401
        async with s.post(base + "/login", data={"token": "s3cret"}, allow_redirects=False) as r:
            assert r.status == 303
            cookie = r.cookies["firstfault_token"]
            assert cookie["httponly"] and cookie["samesite"] == "Strict"
        async with s.get(base + "/") as r:
            assert r.status == 200 and JOB in await r.text()
        async with s.get(base + "/api/jobs", headers={"Authorization": "Bearer s3cret"}) as r:
            assert r.status == 200
    serve(Api(store, load_catalog(), token="s3cret"), client)


def test_paste_limits_hold_per_request_not_per_part(store):
    """16 gzip parts, each small and each inflating below the limit, inflate past it
    together: refused before anything is analysed. The bytes sent count in all, too."""
    part = gzip.compress(b"y" * 3000)  # 3000 bytes inflated, under 4096 alone

    async def client(s, base):
        form = aiohttp.FormData()
        for _ in range(16):
            form.add_field("file", part, filename="log.gz", content_type="application/gzip")
        async with s.post(base + "/paste", data=form) as r:
            assert r.status == 413
        form = aiohttp.FormData(default_to_multipart=True)
        for _ in range(3):  # 3 x 1500 bytes sent: each part under 4096, the request over
            form.add_field("text", "z" * 1500)
        async with s.post(base + "/paste", data=form) as r:
            assert r.status == 413
        async with s.post(base + "/paste", data=_form(file=part)) as r:  # one alone is fine
            assert r.status == 200
    serve(Api(store, load_catalog(), max_paste=4096), client)


def test_a_paste_of_too_many_parts_is_refused(store):
    async def client(s, base):
        form = aiohttp.FormData(default_to_multipart=True)
        for i in range(40):
            form.add_field(f"f{i}", "v")
        async with s.post(base + "/paste", data=form) as r:
            assert r.status == 400 and "at most 16 form parts" in await r.text()
    serve(Api(store, load_catalog()), client)
