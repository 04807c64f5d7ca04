"""notifications: telling people what happened, by e-mail and webhook, once.

Owns Event, WebhookEndpoint, Preference and Delivery (models), recording an event in the sender's transaction,
fanning it out to recipients and sending each delivery once (services), the messages' subjects and texts
(messages), the webhook adapter with its signatures (adapters/), the preferences page (views, forms), and the
delivery, fan-out, expiry-announcement, digest and sweep tasks.

Layer: the top app, below only gpuaas and benchmarks. It may import every app below it (billing, operations,
monitoring, scheduling, pools, pricing, capacity, core, tenancy) and no app imports it. It hears from them
only through their signals (pools, operations, monitoring and billing's), answered by notifications.receivers
(connected in NotificationsConfig.ready()): each receiver writes one Event in the sender's transaction and
everything sent out waits for commit.
"""
