"""The replay's borrowing of idle reservations: flagging idle pools, lending, reclaiming and the borrowers' ends
(a mixin of Replay, which holds the state)."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import connection
from django.db.models import Count

from monitoring.choices import IdleProposal, IdleState
from monitoring.models import IdleReservation
from monitoring.services.lending import lend_idle
from pools import lending, services
from pools.choices import LoanState, RequestState
from pools.models import Allocation, GpuPool, Loan, PoolRequest

from .demand import ANALYZE_EVERY_H, IDLE_ACTIVITY, hours_between


class BorrowingMixin:
    """Replay's borrowing events; every attribute is Replay's."""

    # --- borrowing -------------------------------------------------------------------------------

    def stop_borrowing(self, pk: int, at: dt.datetime) -> None:
        since = self.running_since.pop(pk, None)
        if since is None:
            return
        arrival = self.by_request[pk]
        ran = hours_between(since, at)
        self.remaining_h[pk] = max(0.0, self.remaining_h.get(pk, arrival.hold_h) - ran)
        self.borrowed_active_h += ran * arrival.size * arrival.activity
        self.version[pk] += 1

    def sync_borrowers(self, at: dt.datetime) -> None:
        """Borrowers whose lent units (lent or in their grace period) cover their count run; others stop."""
        held = dict(
            Loan.objects.open()
            .filter(borrower_request__state=RequestState.QUEUED)
            .values_list("borrower_request")
            .annotate(n=Count("pk"))
            .values_list("borrower_request", "n")
        )
        for pk in set(held) | set(self.running_since):
            arrival = self.by_request[pk]
            runs = held.get(pk, 0) >= arrival.size
            if runs and pk not in self.running_since:
                self.running_since[pk] = at
                if pk not in self.started:
                    self.started[pk] = at
                    self.started_borrowing.add(pk)
                left = self.remaining_h.setdefault(pk, arrival.hold_h)
                self.version[pk] += 1
                self.push(at + dt.timedelta(hours=left), f"done:{self.version[pk]}", pk)
            elif not runs and pk in self.running_since:
                self.stop_borrowing(pk, at)

    def borrower_done(self, pk: int, at: dt.datetime) -> None:
        """The borrower's work finished on lent units: it gives them back and withdraws its request."""
        self.stop_borrowing(pk, at)
        self.remaining_h[pk] = 0.0
        for loan in Loan.objects.open().filter(borrower_request_id=pk):
            lending.end_loan(loan, reason="the borrower's work is done", at=at)
        request = PoolRequest.objects.get(pk=pk)
        if request.state == RequestState.QUEUED:
            services.withdraw(request, actor=None, reason="done on borrowed units")
            self.process(at)  # it may have blocked requests of its spec behind it

    def flag_idle(self, pk: int, at: dt.datetime) -> None:
        """The idle detector's flag on each unit of an idle pool still held and not busy again."""
        pool_id = self.pool_of.get(pk)
        if pool_id is None or pool_id in self.need_at:
            return
        units = Allocation.objects.active().filter(pool_id=pool_id)
        window = dt.timedelta(hours=settings.MONITORING_IDLE_WINDOW_H)
        IdleReservation.objects.bulk_create(
            IdleReservation(
                allocation=unit,
                window_start=at - window,
                window_end=at,
                sm_active_avg=IDLE_ACTIVITY * 100,
                coverage=1.0,
                proposal=IdleProposal.RELEASE,
                detected_at=at,
                updated_at=at,
            )
            for unit in units
        )

    def need_back(self, pk: int, at: dt.datetime) -> None:
        """The lender is busy again: its flags clear, and its namespace has a Pending pod while it has units lent."""
        pool_id = self.pool_of.get(pk)
        if pool_id is None or not GpuPool.objects.filter(pk=pool_id, released_at__isnull=True).exists():
            return
        self.need_at[pool_id] = at
        IdleReservation.objects.open().filter(allocation__pool_id=pool_id).update(
            state=IdleState.CLEARED, closed_at=at, updated_at=at
        )
        if Loan.objects.open().filter(lender_pool_id=pool_id).exists():
            self.tick_at(at)

    def reconcile(self, at: dt.datetime) -> None:
        needing = Loan.objects.open().filter(lender_pool_id__in=list(self.need_at))
        self.lender_pods.pending = set(needing.values_list("lender_pool__project__namespace", flat=True))
        lending.reconcile_loans(self.cluster, now=at, client_factory=self.lender_pods)
        self.sync_borrowers(at)
        grace = dt.timedelta(seconds=settings.LENDING_RECLAIM_GRACE_S)
        for requested in Loan.objects.filter(state=LoanState.RECLAIMING).values_list("reclaim_requested_at", flat=True):
            self.tick_at(requested + grace)

    def analyze(self, at: dt.datetime) -> None:
        """Refresh the planner's statistics, as autovacuum does in production. The throwaway database starts
        empty and this server runs without autovacuum: never analysed, the planner takes the tables for
        empty and checks each GPU against every active allocation (an anti-join rescanned per GPU), which
        made each free-unit query cost ~200 ms at 512 GPUs. Plans change, answers do not (every query
        approval and the queue rely on is ordered)."""
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        self.push(at + dt.timedelta(hours=ANALYZE_EVERY_H), "analyze", 0)

    def lend(self, at: dt.datetime) -> None:
        if lend_idle(now=at):
            self.sync_borrowers(at)
        if at + dt.timedelta(seconds=settings.LENDING_INTERVAL_S) < self.end:
            self.push(at + dt.timedelta(seconds=settings.LENDING_INTERVAL_S), "lend", 0)
