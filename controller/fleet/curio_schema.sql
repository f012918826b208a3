-- Curio's task-queue tables ("harmony"), as far as fleetgate reads and writes them.
--
-- Written from the column facts in DOMAIN.md ("Curio's task queue"); Curio's own migrations
-- create more tables and columns. For tests and local development only: fleetgate never
-- creates or migrates Curio's tables in a real database.
--
-- Names are unqualified on purpose: the loader (controller.fleet.curio.create_schema) runs
-- this file after `SET LOCAL search_path TO <schema>`, so one file serves any schema name and
-- no name is ever pasted into SQL text. By hand:
--   psql -h 127.0.0.1 -U postgres test -c 'CREATE SCHEMA curio' \
--        -c 'SET search_path TO curio' -f controller/fleet/curio_schema.sql
-- (psql sends each -c/-f in the same session, so search_path holds for the file.)

CREATE TABLE harmony_machines (
    id serial PRIMARY KEY,
    last_contact timestamptz NOT NULL DEFAULT current_timestamp,
    host_and_port varchar(300) NOT NULL,
    cpu integer NOT NULL,
    ram bigint NOT NULL,
    gpu float NOT NULL,
    unschedulable boolean DEFAULT false,
    restart_request timestamptz
);

CREATE TABLE harmony_task (
    id serial PRIMARY KEY,
    initiated_by integer,
    update_time timestamptz NOT NULL DEFAULT current_timestamp,
    posted_time timestamptz NOT NULL,
    -- pending while NULL; a node claims the task by setting it (FOR UPDATE SKIP LOCKED)
    owner_id integer REFERENCES harmony_machines (id) ON DELETE SET NULL,
    added_by integer NOT NULL,
    previous_task integer,
    name varchar(16) NOT NULL,
    retries bigint NOT NULL DEFAULT 0
);

-- One row per finished run, written by the node that ran it (Curio's 20230719-harmony.sql,
-- completed_by_host_and_port from 20231113, timestamptz since 20240522); work_start and
-- work_end are that node's clock. fleetgate reads the successful runs to time each node.
CREATE TABLE harmony_task_history (
    id serial PRIMARY KEY,
    task_id integer NOT NULL,
    name varchar(16) NOT NULL,
    posted timestamptz NOT NULL,
    work_start timestamptz NOT NULL,
    work_end timestamptz NOT NULL,
    result boolean NOT NULL,
    err varchar,
    completed_by_host_and_port varchar(300) NOT NULL
);

-- Curio's index for recent history per node (20240420-web-task-indexes.sql)
CREATE INDEX harmony_task_history_work_index
    ON harmony_task_history (work_end DESC, completed_by_host_and_port ASC, name ASC, result ASC);
