"""The lowest layer: settings, home layout, store, registry, clients, serving machinery."""

import logging

#: The project's stdlib loggers (every module logs under one of them).
PROJECT_LOGGERS = ("infra", "tasks", "solutions", "flows")

# The project's loggers pass INFO records on (unless configured before this import): in a flow run
# that Prefect starts itself (a deployment on a worker, a served flow), PREFECT_LOGGING_EXTRA_LOGGERS
# gives them Prefect's API handler but no level, and the root logger's WARNING would drop the epochs,
# the split, the candidates and the test metrics before they reach the run's Logs tab. Without a
# handler (plain Python) nothing more is printed: Python's last-resort handler shows WARNING and up.
# Command-line runs set INDUSFLOW_LOG_LEVEL's level (infra.prefect_env.route_project_logs).
for _name in PROJECT_LOGGERS:
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.INFO)
