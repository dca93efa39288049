//! Rewards: functions, worker subprocesses, remote services and a dynamic-batching executor.
