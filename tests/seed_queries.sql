-- Verbatim from /work/shared/seeds/000_fc3b6e52e3ee73d1.txt, section 08
-- ("Observability queries"). Each query follows a '-- query: <name>' line;
-- tests/test_graph_sql.py splits on those lines and runs each one.

-- query: active_sessions_by_stage
SELECT stage, COUNT(*) AS sessions
FROM puramur_sessions_state
WHERE last_message_at > NOW() - INTERVAL '24 hours'
AND handoff_triggered_at IS NULL
GROUP BY stage
ORDER BY sessions DESC;

-- query: sales_funnel_7_days
WITH stages_reached AS (
SELECT
session_id,
ARRAY_AGG(DISTINCT h->>'stage') AS stages,
stage AS current_stage,
handoff_triggered_at
FROM puramur_sessions_state,
jsonb_array_elements(stage_history) h
WHERE created_at > NOW() - INTERVAL '7 days'
GROUP BY session_id, stage, handoff_triggered_at
)
SELECT
COUNT(*) FILTER (WHERE 'greeting' = ANY(stages)) AS reached_greeting,
COUNT(*) FILTER (WHERE 'discovery' = ANY(stages)) AS reached_discovery,
COUNT(*) FILTER (WHERE 'presentation' = ANY(stages)) AS reached_presentation,
COUNT(*) FILTER (WHERE 'cart_building' = ANY(stages)) AS reached_cart,
COUNT(*) FILTER (WHERE handoff_triggered_at IS NOT NULL) AS converted_handoff
FROM stages_reached;

-- query: average_time_per_stage
WITH stage_durations AS (
SELECT
session_id,
h->>'stage' AS stage,
(h->>'exited_at')::timestamptz -
LAG((h->>'exited_at')::timestamptz)
OVER (PARTITION BY session_id ORDER BY ordinality)
AS duration
FROM puramur_sessions_state,
jsonb_array_elements(stage_history) WITH ORDINALITY h(h, ordinality)
)
SELECT
stage,
AVG(EXTRACT(EPOCH FROM duration))::int AS avg_seconds,
COUNT(*) AS samples
FROM stage_durations
WHERE duration IS NOT NULL
GROUP BY stage
ORDER BY avg_seconds DESC;

-- query: most_presented_products
SELECT
p->>'sku' AS sku,
COUNT(*) AS times_presented,
COUNT(*) FILTER (WHERE handoff_triggered_at IS NOT NULL) AS converted
FROM puramur_sessions_state,
jsonb_array_elements(presented_products) p
WHERE created_at > NOW() - INTERVAL '30 days'
GROUP BY sku
ORDER BY times_presented DESC
LIMIT 20;

-- query: handoff_reasons
SELECT
handoff_reason,
COUNT(*) AS count,
AVG(cart_total)::numeric(10,0) AS avg_cart,
AVG(EXTRACT(EPOCH FROM handoff_triggered_at - created_at))::int AS avg_time_to_handoff_sec
FROM puramur_sessions_state
WHERE handoff_triggered_at IS NOT NULL
AND handoff_triggered_at > NOW() - INTERVAL '30 days'
GROUP BY handoff_reason
ORDER BY count DESC;
