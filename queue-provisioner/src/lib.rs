//! asya-queue-provisioner
