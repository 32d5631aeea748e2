"""Budget and fleet notifications to webhooks (policy ``notifications:``).

* :mod:`~orchestrator.notify.watch`: what deserves a notification now, claimed once per
  (target, subject, window, grade) in the store;
* :mod:`~orchestrator.notify.deliver`: one HTTP attempt to a target whose URL is a secret;
* :mod:`~orchestrator.notify.sender`: the embedded loop's sender thread (retries, backoff).

With Celery, ``burst.reconcile.run`` checks and hands each claimed row to the
``burst.notify.send`` task, which retries with backoff. docs/monitoring.md describes the events.
"""
