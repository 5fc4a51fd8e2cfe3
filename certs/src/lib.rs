//! asya-certs
