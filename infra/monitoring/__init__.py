"""Monitoring: on cloud stacks the releases Soperator's reference install uses (``releases``) and how to reach
their dashboards (``access``); on every stack the job metrics in Prometheus (``prometheus``, ``jobs``, ``live``,
``view``)."""
