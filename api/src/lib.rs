//! asya-api
