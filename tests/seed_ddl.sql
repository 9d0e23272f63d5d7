-- Verbatim from /work/shared/seeds/000_fc3b6e52e3ee73d1.txt, section 05
-- ("Full puramur_sessions_state DDL"): the production table that
-- `funnel sql funnels/puramur.yaml` must reproduce (tests/test_graph_sql.py).
CREATE TABLE puramur_sessions_state (
session_id TEXT PRIMARY KEY,
-- Stage machine
stage TEXT NOT NULL DEFAULT 'greeting',
stage_iteration INT NOT NULL DEFAULT 0,
stage_history JSONB NOT NULL DEFAULT '[]',
-- Customer and pet
customer JSONB NOT NULL DEFAULT '{}',
pet JSONB NOT NULL DEFAULT '{}',
-- Funnel progress
discovery_completeness INT NOT NULL DEFAULT 0,
conversation_summary TEXT DEFAULT '',
-- Sales tracking
presented_products JSONB NOT NULL DEFAULT '[]',
objections_raised JSONB NOT NULL DEFAULT '[]',
-- Cart
cart JSONB NOT NULL DEFAULT '[]',
cart_item_count INT NOT NULL DEFAULT 0,
cart_total NUMERIC(10,2) NOT NULL DEFAULT 0,
cart_gift_eligible BOOLEAN NOT NULL DEFAULT FALSE,
cart_free_delivery BOOLEAN NOT NULL DEFAULT FALSE,
-- Language
detected_language TEXT DEFAULT 'uk',
response_language TEXT DEFAULT 'uk',
-- Handoff
handoff_channel TEXT,
handoff_triggered_at TIMESTAMPTZ,
handoff_reason TEXT,
-- Timeline
created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
updated_at TIMESTAMPTZ NOT NULL DEFAULT NOW(),
last_message_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
CREATE INDEX idx_sessions_stage ON puramur_sessions_state(stage);
CREATE INDEX idx_sessions_last_msg ON puramur_sessions_state(last_message_at DESC);
CREATE INDEX idx_sessions_handoff ON puramur_sessions_state(handoff_triggered_at)
WHERE handoff_triggered_at IS NOT NULL;
