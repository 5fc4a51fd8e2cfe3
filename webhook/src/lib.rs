//! asya-webhook
