"""Admission control at an entry node: bounded active requests, a bounded queue, then 429 + Retry-After."""

from __future__ import annotations

import asyncio

import openai
import pytest
from helpers import openai_client, wait_until
from node_process import running_node
from swarm.bench.cluster import get_json

from swarm.api.admission import Admission, Overloaded


# -- the admission object itself, on a real event loop --------------------------------------------

def test_slots_are_handed_over_in_arrival_order_and_the_queue_is_bounded():
    async def main():
        adm = Admission(max_active=1, max_queued=2)
        order: list[str] = []
        release = asyncio.Event()

        async def request(name: str, hold: asyncio.Event | None = None):
            async with adm.slot():
                order.append(name)
                if hold is not None:
                    await hold.wait()

        first = asyncio.create_task(request("a", release))
        await asyncio.sleep(0)
        queued = [asyncio.create_task(request(n)) for n in ("b", "c")]
        await asyncio.sleep(0)
        assert (adm.active, adm.queued) == (1, 2)
        with pytest.raises(Overloaded) as refused:
            async with adm.slot():
                pass
        assert refused.value.status == 429 and refused.value.retry_after_s >= 1
        resp = refused.value.response()
        assert resp.status == 429 and int(resp.headers["Retry-After"]) >= 1
        release.set()
        await asyncio.gather(first, *queued)
        assert order == ["a", "b", "c"]
        assert (adm.active, adm.queued, adm.refused) == (0, 0, 1)

    asyncio.run(main())


def test_a_waiter_that_gives_up_frees_its_place():
    async def main():
        adm = Admission(max_active=1, max_queued=1)
        release = asyncio.Event()

        async def hold():
            async with adm.slot():
                await release.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(hold())
        await asyncio.sleep(0)
        assert adm.queued == 1
        waiter.cancel()  # its client went away while it waited
        await asyncio.sleep(0)
        assert adm.queued == 0
        release.set()
        await holder
        assert adm.active == 0
        async with adm.slot():  # the slot is free again
            assert adm.active == 1

    asyncio.run(main())


# -- a real node, the official openai client ------------------------------------------------------

def test_a_full_node_answers_429_with_retry_after_and_the_admitted_ones_finish_equal(tmp_path, llama):
    kwargs = dict(model="llama", messages=[{"role": "user", "content": "count"}], temperature=0, max_tokens=400)
    with running_node(tmp_path, "--model", str(llama), "--max-active", "1", "--max-queue", "1") as node:
        client = openai_client(node.url)
        alone = client.chat.completions.create(**kwargs).choices[0].message.content

        def admission() -> dict:
            return get_json(node.url + "/health")[1]["admission"]

        first = client.chat.completions.create(stream=True, **kwargs)
        head = next(first)  # it holds the one active slot (we read no further for now)
        import threading
        second: dict = {}
        t = threading.Thread(target=lambda: second.update(
            text=client.chat.completions.create(**kwargs).choices[0].message.content))
        t.start()
        wait_until(lambda: admission()["queued"] == 1, 30, "the second request queued")
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(**kwargs)
        err = refused.value
        assert err.status_code == 429 and int(err.response.headers["retry-after"]) >= 1
        assert err.body["code"] == "overloaded" and "--max-active 1" in err.body["message"]
        assert err.body["type"] == "rate_limit_error"
        rest = "".join(c.choices[0].delta.content or "" for c in first if c.choices)
        assert (head.choices[0].delta.content or "") + rest == alone
        t.join(120)
        assert second["text"] == alone
        wait_until(lambda: admission()["active"] == 0, 30, "the slot given back")
        assert admission() == {"active": 0, "queued": 0, "max_active": 1, "max_queued": 1, "refused": 1}
